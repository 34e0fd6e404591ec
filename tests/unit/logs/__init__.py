"""The real logs the unit tier reads: ``LOGS / "NAME.jsonl"``, written by ``make.py``."""

from pathlib import Path

LOGS = Path(__file__).resolve().parent
