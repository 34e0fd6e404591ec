"""hooktrace's benchmark suite: ``python -m bench`` from the repository root (see README.md).

Not part of the installed package nor of the test suite.
"""
