"""``hooktrace check``: a log in, findings out. Never imports torch or the tracing side."""
