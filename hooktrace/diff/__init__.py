"""``hooktrace diff``: where two runs part ways. Never imports torch or the tracing side."""
