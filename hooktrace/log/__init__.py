"""The log contract, and what the tracing and reading sides share: standard library only.

Imports nothing else of hooktrace (an import-linter contract in CI says so).
"""
