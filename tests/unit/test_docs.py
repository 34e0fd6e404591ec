"""The documentation holds together: every link and image in README.md, docs/*.md and
bench/README.md points at a file that exists (and a heading that exists, for ``#anchor``), and the
README stays a five-minute read that keeps the command CI runs."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[2]
TEST_COMMAND = "bash .ci/setup-tests && .venv/bin/python -m pytest -q"
QUICK_START = (
    "bash .ci/setup && .venv/bin/hooktrace run samples/mnist_net.py"
    " && .venv/bin/hooktrace render hooktrace.jsonl && .venv/bin/hooktrace check hooktrace.jsonl"
)
README_MAX_LINES = 250

_FENCE = re.compile(r"^\s*(```|~~~)")
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
# [text](target) and ![alt](target), with an optional "title"; text may hold `code` or an image
_INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
_HTML = re.compile(r"""<(?:a|img)\s[^>]*?(?:href|src)\s*=\s*["']([^"']*)["']""", re.IGNORECASE)
_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")


def pages() -> list[Path]:
    """The Markdown files the tests hold to their links."""
    found = [ROOT / "README.md", ROOT / "bench" / "README.md"]
    return [p for p in found if p.is_file()] + sorted((ROOT / "docs").glob("*.md"))


def prose(text: str) -> list[tuple[int, str]]:
    """The lines outside fenced code blocks, numbered from 1."""
    out, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            out.append((number, line))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its rendered text, lower case, punctuation but ``-`` and
    ``_`` dropped, spaces to ``-``."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = re.sub(r"<[^>]+>", "", text).replace("`", "")
    text = re.sub(r"\*\*|__|\*|(?<!\w)_|_(?!\w)", "", text)  # emphasis, not snake_case
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of a page's headings; a repeated heading gets ``-1``, ``-2``, as on GitHub."""
    seen: dict[str, int] = {}
    out = set()
    for _, line in prose(path.read_text(encoding="utf-8")):
        m = _HEADING.match(line)
        if m:
            base = slug(m.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            out.add(base if count == 0 else f"{base}-{count}")
    return out


def links(path: Path) -> list[tuple[int, str]]:
    """Every link and image target of a page, with its line: inline, reference and HTML; none
    from code (fenced blocks, code spans)."""
    out = set()
    for number, line in prose(path.read_text(encoding="utf-8")):
        line = _CODE_SPAN.sub("", line)
        for pattern in (_INLINE, _REFERENCE, _HTML):
            out.update((number, m.group(1)) for m in pattern.finditer(line))
    return sorted(out)


def problem(page: Path, target: str, root: Path = ROOT) -> str | None:
    """What is wrong with one link of ``page``, or None."""
    if not target:
        return "empty link"
    parts = urlsplit(target)
    if parts.scheme in ("http", "https"):
        if not parts.netloc or "." not in parts.netloc or " " in target:
            return "not a well-formed web address"
        return None  # no network here: only the form is checked
    if parts.scheme or parts.netloc:
        return f"a {parts.scheme or 'network'} link: use a relative path or an http(s) address"
    if parts.path.startswith("/"):
        return "an absolute path: on GitHub it leaves the repository; use a relative one"
    file = (page.parent / unquote(parts.path)).resolve() if parts.path else page.resolve()
    if root.resolve() not in (file, *file.parents):
        return "points outside the repository"
    if not file.exists():
        return "no such file"
    if parts.fragment:
        if file.suffix != ".md" or file.is_dir():
            return "an anchor into a file that is not a Markdown page"
        if parts.fragment not in anchors(file):
            return f"no heading #{parts.fragment} in {file.name}"
    return None


def broken(page: Path, root: Path = ROOT) -> list[str]:
    """Each broken link of a page, as ``page:line: target: why``."""
    name = page.relative_to(root).as_posix()
    return [
        f"{name}:{number}: {target}: {why}"
        for number, target in links(page)
        if (why := problem(page, target, root)) is not None
    ]


def test_the_pages_exist() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in pages()}
    assert {"README.md", "bench/README.md"} <= names
    assert any(n.startswith("docs/") for n in names)


@pytest.mark.parametrize("page", pages(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_links_and_images_resolve(page: Path) -> None:
    problems = broken(page)
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_readme_reads_in_five_minutes() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) < README_MAX_LINES, f"{len(lines)} lines: move reference to docs/"


def test_readme_keeps_the_commands_ci_and_newcomers_run() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert TEST_COMMAND in text
    assert QUICK_START in text


def test_ci_runs_the_readmes_test_command() -> None:
    assert TEST_COMMAND in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


def test_the_quick_start_sets_up_without_the_test_setup() -> None:
    """The quick start's setup is not the tests': it installs no browser and no dev extras."""
    setup = (ROOT / ".ci" / "setup").read_text(encoding="utf-8")
    code = [line for line in setup.splitlines() if not line.lstrip().startswith("#")]
    assert not [line for line in code if "chromium" in line or "[dev]" in line]


def test_the_pictures_are_shown() -> None:
    targets = {t for _, t in links(ROOT / "README.md")}
    assert {"docs/mnist.svg", "docs/view.png"} <= targets


# the checker itself: it must be able to fail


def test_slugs_follow_github() -> None:
    assert slug("Saving tensors: `--capture`") == "saving-tensors---capture"
    assert slug("Several processes: `torchrun`, DDP, FSDP") == "several-processes-torchrun-ddp-fsdp"
    assert slug("What `check` finds") == "what-check-finds"
    assert slug("no_grad and **bold**") == "no_grad-and-bold"


def test_the_checker_finds_broken_links(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "other.md").write_text("# Other page\n\n## A `code` heading\n")
    (tmp_path / "docs" / "pic.png").write_bytes(b"")
    page = tmp_path / "docs" / "page.md"
    page.write_text(
        "# Page\n\n"
        "[fine](other.md) [fine](other.md#a-code-heading) ![fine](pic.png) [fine](#page)\n"
        "[fine](https://example.org/x) [`code` text](other.md) [`other.md`](other.md)\n"
        "```\n[not a link](inside-a-fence.md)\n```\n"
        "`[not a link](in-a-code-span.md)`\n"
        "[missing](nowhere.md)\n"
        "![missing picture](gone.svg)\n"
        "[bad anchor](other.md#no-such-heading)\n"
        "[bad own anchor](#nope)\n"
        "[absolute](/docs/other.md)\n"
        "[outside](../../x.md)\n"
        "[bad web](https://)\n"
        '<img src="also-gone.png">\n'
    )
    found = broken(page, tmp_path)
    assert [line.split(": ")[1] for line in found] == [
        "nowhere.md",
        "gone.svg",
        "other.md#no-such-heading",
        "#nope",
        "/docs/other.md",
        "../../x.md",
        "https://",
        "also-gone.png",
    ], found
