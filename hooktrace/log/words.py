"""How counts read in every command's output: ``1 step``, ``3 steps``."""


def plural(n: int, word: str) -> str:
    """``1 step``, ``3 steps``: the counts every report prints."""
    return f"{n} {word}" + ("" if n == 1 else "s")
