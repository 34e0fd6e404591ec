"""How the reports word what they name: counts (``3 steps``), runs of steps (``0-2, 5``), a
model's root module (``(root)``), names with control characters escaped, shapes as
``8x3x224x224``, rows in aligned columns: the same in every command's output. Standard library
only."""

from __future__ import annotations

from collections.abc import Sequence

from hooktrace.log.schema import Shape

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


def printable(text: str) -> str:
    """``text`` with control characters written as escapes: a newline becomes ``\\n``."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                   for c in text)


def shape_text(shape: Shape | None, times: str = "x") -> str:
    """``[8, 3, 224, 224]`` -> ``8x3x224x224``; ``[]`` (a scalar) -> ``()``; None -> ``-``."""
    if shape is None:
        return "-"
    return times.join(map(str, shape)) if shape else "()"


def shapes_text(shapes: Sequence[Shape | None], times: str = "x", most: int = 3) -> str:
    """Several shapes, at most ``most`` of them: ``8x10, 8x4 +2``."""
    shown = ", ".join(shape_text(s, times) for s in shapes[:most])
    return f"{shown} +{len(shapes) - most}" if len(shapes) > most else shown


def module_text(fqn: str) -> str:
    """``fqn_text``, control characters escaped: how the table and the pictures show a fqn."""
    return printable(fqn) if fqn else ROOT


def columns(rows: list[list[str]], indent: str = "") -> list[str]:
    """Rows of cells as aligned lines: the first cell right-aligned (a number), the others
    left-aligned, two spaces apart."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [(indent + "  ".join([r[0].rjust(widths[0]), *(c.ljust(w) for c, w in
                                 zip(r[1:], widths[1:], strict=True))])).rstrip() for r in rows]
