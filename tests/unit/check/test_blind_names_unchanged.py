"""What ``check`` names in every case of the blind sets: the bugs written blind and their
healthy look-alikes (``tests/scripts/blind_*.py``), their logs checked in as one archive per
script under tests/unit/logs/blind/, and beside them, per case, each finding's severity, kind,
cause, model, module and step (not its words: wording may change, detection may not). A change
of the readers that names another culprit, cause or step, or warns on a healthy case, fails
here; a change meant to alter what ``check`` finds writes the names anew
(``python tests/unit/check/test_blind_names_unchanged.py``) and their diff is reviewed."""

from __future__ import annotations

import sys
import tarfile
from pathlib import Path

import pytest

from hooktrace.check.checklog import run_checks

BLIND = Path(__file__).resolve().parents[1] / "logs" / "blind"
ARCHIVES = sorted(BLIND.glob("*.tar.gz"))
SEPARATOR = "=== "


def logs(archive: Path) -> dict[str, bytes]:
    """Each log of ``archive`` by its member's name."""
    with tarfile.open(archive) as tar:
        return {m.name: tar.extractfile(m).read()  # type: ignore[union-attr]
                for m in tar.getmembers()}


def said(log: Path) -> str:
    """What ``check`` names in ``log``: a line per finding, in the report's order."""
    return "\n".join(f"{f.severity} {f.kind}/{f.cause} {f.model}:{f.module or '(root)'} "
                     f"step {f.step}" for f in run_checks(log).findings)


def reports(archive: Path, folder: Path) -> dict[str, str]:
    """What check says of each log of ``archive``, by its member's name."""
    out = {}
    for name, raw in logs(archive).items():
        (folder / name).write_bytes(raw)
        out[name] = said(folder / name)
    return out


def golden(archive: Path) -> Path:
    return archive.with_name(archive.name.removesuffix(".tar.gz") + ".check.txt")


def read(path: Path) -> dict[str, str]:
    """A reports file: ``=== NAME`` lines, each followed by its report."""
    out, name = {}, ""
    for line in path.read_text().splitlines(keepends=True):
        if line.startswith(SEPARATOR):
            name = line.removeprefix(SEPARATOR).strip()
            out[name] = ""
        else:
            out[name] += line
    return {name: text.removesuffix("\n") for name, text in out.items()}


def test_every_blind_script_has_its_logs() -> None:
    assert [a.name.split(".")[0] for a in ARCHIVES] == [
        "blind_bugs", "blind_bugs3", "blind_bugs4", "blind_bugs5", "blind_model"]
    assert sum(len(read(golden(a))) for a in ARCHIVES) >= 200


@pytest.mark.parametrize("archive", ARCHIVES, ids=lambda a: a.name.split(".")[0])
def test_the_reports_are_unchanged(archive: Path, tmp_path: Path) -> None:
    now, then = reports(archive, tmp_path), read(golden(archive))
    assert list(now) == list(then)
    changed = [name for name in now if now[name] != then[name]]
    assert changed == [], f"check names another thing in {changed[:5]}: {now[changed[0]]}"


def write() -> None:
    import tempfile
    for archive in ARCHIVES:
        with tempfile.TemporaryDirectory() as tmp:
            made = reports(archive, Path(tmp))
        golden(archive).write_text("".join(f"{SEPARATOR}{name}\n{text}\n"
                                           for name, text in made.items()))


if __name__ == "__main__":
    write()
    sys.exit(0)
