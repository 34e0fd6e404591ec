"""A drawn step: ``render``'s options (``RenderOptions``), the picture of one step of a log
(``Picture``, for Python and notebooks), and ``write_picture`` for ``hooktrace render``.
Reading a log and drawing it never imports torch."""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, Union

from hooktrace.check.checklog import check_collected, run_checks
from hooktrace.check.collect import Collector
from hooktrace.check.findings import Finding
from hooktrace.log.errors import HooktraceError
from hooktrace.log.reader import LogReader
from hooktrace.log.words import plural
from hooktrace.show.graph import build
from hooktrace.show.marks import marks
from hooktrace.show.output import choose_format, default_output, mark, refuse_log, write_file
from hooktrace.show.render import dot
from hooktrace.show.steplog import StepLog, load_step

FORMATS = ("dot", "svg", "png", "pdf")


class _HasPath(Protocol):
    @property
    def path(self) -> Path: ...


LogLike = Union[str, "os.PathLike[str]", _HasPath]  # a path, or a hooktrace.trace() session


@dataclass(frozen=True, slots=True)
class RenderOptions:
    """What to draw of a log; see ``hooktrace render --help``. ``findings``: outline where
    ``check`` finds a problem (it reads the whole log); ``every_call``: a node per call, also
    of a module called many times; ``ops``: the operations of zoomed calls inside their
    boxes."""

    step: int | None = None
    model: str | None = None
    depth: int | None = None
    phase: str = "both"
    findings: bool = True
    every_call: bool = False
    ops: bool = False


@dataclass(slots=True)
class Picture(dot.Laid):
    """The DOT source of one step's call graph; a notebook shows it as SVG."""

    source: str
    step: int
    depth: int
    auto_depth: bool
    nodes: int
    forward_edges: int
    backward_edges: int
    warnings: list[str] = field(default_factory=list)
    captured: str | None = None  # the run's --capture folder, "<folder> (N files)"
    problems: int = 0  # check's problems outlined in the picture
    elsewhere: list[int] = field(default_factory=list)  # the steps of those not in it

    def summary(self) -> str:
        depth = f"depth {self.depth}{' (auto)' if self.auto_depth else ''}"
        edges = self.forward_edges + self.backward_edges
        captured = f"; captured tensors: {self.captured}" if self.captured else ""
        outlined = f"; {plural(self.problems, 'problem')} of check outlined" \
            if self.problems else ""
        return (f"step {self.step}, {depth}: {plural(self.nodes, 'module')}, "
                f"{plural(edges, 'edge')} "
                f"({self.forward_edges} forward, {self.backward_edges} backward)"
                f"{outlined}{captured}")


def _log_path(log: LogLike) -> Path:
    return Path(log.path if hasattr(log, "path") else log)


def draw(log: LogLike, options: RenderOptions) -> Picture:
    """The call graph of one step of ``log``, as ``options`` say."""
    path = _log_path(log)
    step, model = options.step, options.model
    if options.findings:
        loaded, problems, warnings = _read_and_check(path, step, model)
    else:
        loaded, problems, warnings = load_step(path, step, model), [], []
    view = build(loaded, options.depth, options.phase, options.every_call)
    view.ops = options.ops
    drawn = marks(view, problems)
    outlined = {id(f) for inside in drawn.values() for f in inside}
    elsewhere = sorted({f.step for f in problems if id(f) not in outlined and f.step is not None
                        and f.step != loaded.step and f.step in loaded.steps  # --step draws it
                        and model in (None, f.model)})
    edges = view.edges()
    forward = sum(e.phase == "forward" for e in edges)
    return Picture(dot.to_dot(view, drawn), loaded.step, view.depth, view.auto_depth,
                   len(view.node_map), forward, len(edges) - forward,
                   [*loaded.warnings, *warnings], loaded.captured, len(outlined), elsewhere)


def _read_and_check(path: Path, step: int | None, model: str | None
                    ) -> tuple[StepLog, list[Finding], list[str]]:
    """The step to draw and check's problems in the whole log, in one pass over it (which then
    reads every step in full). Where that pass fails (a damaged line in a step not drawn, or
    one check cannot read), the log is read as before: the step alone, then check, whose
    error (if any) is the picture's warning: the picture is still drawn."""
    try:
        reader = LogReader(path)
        collector = Collector(reader)
        loaded = load_step(reader, step, model, collector.take)
        return loaded, check_collected(collector.finish(), path=path).problems, []
    except HooktraceError:
        loaded = load_step(path, step, model)
    try:
        return loaded, run_checks(path).problems, []
    except HooktraceError as e:
        return loaded, [], [f"problems of check not outlined: {e}"]


def picture(log: LogLike, *, step: int | None = None, model: str | None = None,
            depth: int | None = None, phase: str = "both", findings: bool = True,
            every_call: bool = False, ops: bool = False) -> Picture:
    """The call graph of one step of ``log``; the options are ``RenderOptions``'s."""
    return draw(log, RenderOptions(step, model, depth, phase, findings, every_call, ops))


def render(log: LogLike, *, step: int | None = None, model: str | None = None,
           depth: int | None = None, phase: str = "both", findings: bool = True,
           every_call: bool = False, ops: bool = False) -> Picture:
    """For notebooks: ``picture()``, with the log's warnings (a missing end record) raised as
    Python warnings. Displaying the result needs the Graphviz ``dot`` program."""
    result = draw(log, RenderOptions(step, model, depth, phase, findings, every_call, ops))
    for message in result.warnings:
        warnings.warn(message, stacklevel=2)
    return result


@dataclass(slots=True)
class Written:
    path: Path
    format: str
    picture: Picture

    def summary(self) -> str:
        return f"wrote {self.path}: {self.picture.summary()}"


def write_picture(log: str | os.PathLike[str], output: str | os.PathLike[str] | None = None,
                  fmt: str | None = None, options: RenderOptions | None = None) -> Written:
    """``hooktrace render``: draw one step of ``log`` into ``output`` (default: the log's name
    with the format's extension). Without the ``dot`` program the DOT text is written to a
    ``.dot`` file next to ``output`` and DotMissingError says so."""
    log = Path(log)
    out = Path(output) if output is not None else None
    if out is not None:
        refuse_log(out, log)  # before anything else: the clearest message for this mistake
    chosen = choose_format(fmt, out, FORMATS, "svg", strict=True)
    refuse_log(out or log.with_suffix(f".{chosen}"), log)  # a log named x.svg
    out = out or default_output(log.with_suffix(f".{chosen}"))
    result = draw(log, options or RenderOptions())
    if chosen == "dot":
        data = result.source.encode("utf-8")
    else:
        try:
            data = result.pipe(chosen)
        except dot.DotMissingError as e:
            dot_file = default_output(out.with_suffix(".dot"))
            write_file(dot_file, result.source.encode("utf-8"), log)
            raise dot.DotMissingError(f"wrote {dot_file} only: {e}") from None
    write_file(out, mark(data, chosen), log)
    return Written(out, chosen, result)
