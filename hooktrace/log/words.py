"""How the reports word what they name: counts (``3 steps``), runs of steps (``0-2, 5``), and a
model's root module (``(root)``), the same in every command's output."""

#: how a model's root module (its fqn is ``""``) is named in every output, and in ``--module``
ROOT = "(root)"


def plural(n: int, word: str) -> str:
    """``1 step``, ``3 steps``: the counts every report prints."""
    return f"{n} {word}" + ("" if n == 1 else "s")


def fqn_text(fqn: str | None) -> str:
    """A module's fqn as the reports show it: ``layer1.0``, ``(root)`` for a model's root."""
    return fqn or ROOT


def ranges(numbers: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"`` (steps in messages)."""
    runs: list[list[int]] = []
    for n in sorted(numbers):
        if runs and n == runs[-1][-1] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)
