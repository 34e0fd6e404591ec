"""What a person looks at: call graphs (``render``, ``show``), the ``view`` page and ``export``'s
rows. Never imports torch or the tracing side."""
