"""Whether .venv holds what a setup script installs, so that it can skip pip (seconds per run
even when nothing changes): hooktrace installed editable from this checkout, after the last
change of pyproject.toml, and each requirement of hooktrace and of the extra named (torch, dev)
installed. Exit 0 when it does; else one line on stderr says what is missing, exit 1.

Standard library only: it runs before anything is installed. Versions are pip's to check when
it installs; this only asks whether each package is there.
"""

from __future__ import annotations

import json
import re
import sys
from importlib import metadata
from pathlib import Path
from urllib.parse import urlsplit
from urllib.request import url2pathname

ROOT = Path(__file__).resolve().parent.parent
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def missing(extra: str) -> str | None:
    """What .venv lacks for ``extra``, or None."""
    try:
        dist = metadata.distribution("hooktrace")
    except metadata.PackageNotFoundError:
        return "hooktrace is not installed"
    url = json.loads(dist.read_text("direct_url.json") or "{}")
    source = urlsplit(url.get("url", ""))
    if not url.get("dir_info", {}).get("editable") or source.scheme != "file" \
            or Path(url2pathname(source.path)).resolve() != ROOT:
        return "hooktrace is not installed editable from this checkout"
    record = next((f for f in dist.files or [] if f.name == "METADATA"), None)
    changed = (ROOT / "pyproject.toml").stat().st_mtime
    if record is None or Path(str(dist.locate_file(record))).stat().st_mtime < changed:
        return "pyproject.toml changed since hooktrace was installed"
    for line in dist.requires or []:
        requirement, _, marker = line.partition(";")
        if marker.strip() and f'extra == "{extra}"' not in marker:
            continue
        name = _NAME.match(requirement.strip())
        if name is None:
            continue
        try:
            metadata.version(name.group())
        except metadata.PackageNotFoundError:
            return f"{name.group()} is not installed"
    return None


if __name__ == "__main__":
    found = missing(sys.argv[1] if len(sys.argv) > 1 else "torch")
    if found:
        print(f"setup: {found}", file=sys.stderr)
    sys.exit(1 if found else 0)
