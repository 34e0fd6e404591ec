"""The observers of a tracing session: each takes the core's records and measures or writes
one thing (the log, statistics, watched steps, captures, the training loop around the modules)."""
