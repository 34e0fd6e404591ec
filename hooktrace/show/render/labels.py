"""How names and shapes are written in the table, the pictures and the page: control
characters escaped, a model's root as ``(root)``, shapes as ``8x3x224x224``, rows in aligned
columns. Standard library only."""

from __future__ import annotations

from collections.abc import Sequence

from hooktrace.log import schema
from hooktrace.log.words import ROOT


def printable(text: str) -> str:
    """``text`` with control characters written as escapes: a newline becomes ``\\n``."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                   for c in text)


def shape_text(shape: schema.Shape | None, times: str = "x") -> str:
    """``[8, 3, 224, 224]`` -> ``8x3x224x224``; ``[]`` (a scalar) -> ``()``; None -> ``-``."""
    if shape is None:
        return "-"
    return times.join(map(str, shape)) if shape else "()"


def shapes_text(shapes: Sequence[schema.Shape | None], times: str = "x", most: int = 3) -> str:
    """Several shapes, at most ``most`` of them: ``8x10, 8x4 +2``."""
    shown = ", ".join(shape_text(s, times) for s in shapes[:most])
    return f"{shown} +{len(shapes) - most}" if len(shapes) > most else shown


def module_text(fqn: str) -> str:
    """How a fqn is shown: the root of a model is ``(root)``."""
    return printable(fqn) if fqn else ROOT


def columns(rows: list[list[str]], indent: str = "") -> list[str]:
    """Rows of cells as aligned lines: the first cell right-aligned (a number), the others
    left-aligned, two spaces apart."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [(indent + "  ".join([r[0].rjust(widths[0]), *(c.ljust(w) for c, w in
                                 zip(r[1:], widths[1:], strict=True))])).rstrip() for r in rows]
