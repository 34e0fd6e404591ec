"""Imported by uses_sibling.py: works only when the script's folder is on sys.path."""

GREETING = "hello from helper_mod"
