"""What the log says ran, on the field programs of tests/scripts/field_names.py (issue 47, items
1 to 3): each case run by ``hooktrace run``, read by the real commands."""

from __future__ import annotations

from pathlib import Path

from helpers import Traced, hooktrace_cmd

SCRIPT = Path(__file__).parent.parent / "scripts" / "field_names.py"


def _line(text: str, after: str = "") -> int:
    """The line number of the first line of the script that starts with ``text`` (stripped),
    after the first that starts with ``after``."""
    lines = [line.strip() for line in SCRIPT.read_text().splitlines()]
    start = lines.index(next(x for x in lines if x.startswith(after))) if after else 0
    return next(i for i, x in enumerate(lines[start:], start + 1) if x.startswith(text))


def _sources(log: Path) -> list[str]:
    """check's ``source:`` lines, each file by its name (where the run was is no matter)."""
    result = hooktrace_cmd("check", log)
    assert result.returncode == 1, result.stderr  # the detached branch
    return [f"{Path(site).name} {where}" for line in result.stdout.splitlines()
            if line.strip().startswith("source:")
            for site, where in [line.split()[1:3]]]


def test_a_decorated_forward_is_found_at_its_def(traced: Traced) -> None:
    """``@torch.autocast`` wraps ``forward`` in torch's ``decorate_autocast``: the source is the
    user's ``def``, not the decorator's file."""
    line = _line("def forward", after="@torch.autocast")
    assert _sources(traced(SCRIPT, "decorated")) == [
        f"field_names.py:{line} (Decorated.forward)"]


def test_an_undecorated_forward_keeps_its_line(traced: Traced) -> None:
    line = _line("def forward", after="class Branches")
    assert _sources(traced(SCRIPT, "plain")) == [f"field_names.py:{line} (Branches.forward)"]
