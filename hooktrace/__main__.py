"""``python -m hooktrace`` is the ``hooktrace`` command."""

from hooktrace.cli import main

if __name__ == "__main__":
    main()
