"""The hooktrace version: ``hooktrace.__version__``, and what each log's header says wrote it."""

__version__ = "0.2.0"
