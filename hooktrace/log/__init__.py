"""The log contract, and what the tracing and reading sides share: the records (schema), their
wire form and its reading and writing, the trace options, log discovery, wording and the error
types. Standard library and orjson only (no torch: the reading side runs without it).

Imports nothing else of hooktrace (an import-linter contract in CI says so).
"""
