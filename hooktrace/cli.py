"""The ``hooktrace`` command: parse options, call one library function, print, exit.

Exit status: 0 ok, 1 problems found (``check``) or runs that differ (``diff``), 2 bad input or
usage; ``run`` exits with the script's own status.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from hooktrace.diff.compare import DEFAULT_ATOL, DEFAULT_RTOL
from hooktrace.log.errors import HooktraceError
from hooktrace.log.options import DEFAULTS, TraceOptions
from hooktrace.log.version import __version__
from hooktrace.log.words import ROOT


class _UserError(click.ClickException):
    exit_code = 2

    def show(self, file: Any = None) -> None:
        click.echo(f"hooktrace: error: {self.format_message()}", err=True)


class _Group(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except HooktraceError as e:
            raise _UserError(str(e)) from None


_EVERY_CALL = click.option(
    "--every-call", is_flag=True,
    help="Draw each call of a module as its own node. Default: a module called more than 16 "
         "times in the step (an unrolled loop) is one node, 'LSTMCell x999'.")


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="hooktrace")
def cli() -> None:
    """Trace the forward and backward order of PyTorch modules, and debug gradient flow."""


@cli.command("run", context_settings={"allow_interspersed_args": False})
@click.option("-o", "--output", type=click.Path(path_type=Path), default="hooktrace.jsonl",
              show_default=True, help="Where to write the log (JSON lines).")
@click.option("-m", "as_module", is_flag=True, help="Run TARGET as a module, like python -m.")
@click.option("--include", multiple=True, metavar="GLOB",
              help="Record only modules whose fqn or class matches (repeatable), e.g. "
                   "'layer4*' or 'Conv2d'.")
@click.option("--exclude", multiple=True, metavar="GLOB",
              help="Do not record modules whose fqn or class matches (repeatable).")
@click.option("--steps", metavar="RANGES", default=DEFAULTS.steps.text, show_default=True,
              help="Steps (backward passes) to record in full, e.g. 0:3, 0,100:102, or all.")
@click.option("--max-events", type=click.IntRange(min=1), default=DEFAULTS.max_events,
              show_default=True, help="Stop recording after this many events.")
@click.option("--no-stats", is_flag=True,
              help="Record no gradient norms, NaN/Inf checks or parameter-gradient norms.")
@click.option("--no-watch", is_flag=True,
              help="After the recorded steps, stop tracing instead of watching every step for "
                   "NaN/Inf and modules that lose their gradient.")
@click.option("--break-on", type=click.Choice(["nan"]),
              help="Stop at the first module whose output or backward is NaN/Inf: pdb opens "
                   "at your line that called it (without a terminal, the program stops with "
                   "one line).")
@click.option("--capture", multiple=True, metavar="GLOB",
              help="Save inputs, outputs and gradients of modules whose fqn or class matches "
                   "(recorded steps) with torch.save into LOG's .capture folder, e.g. "
                   "'layer4*' or 'Conv2d'.")
@click.option("--capture-max-mb", type=click.IntRange(min=1), default=DEFAULTS.capture_max_mb,
              show_default=True,
              help="Stop capturing once the saved tensors reach this size.")
@click.option("--strict", is_flag=True,
              help="If the log cannot be written (disk full), raise the error into the script "
                   "instead of stopping tracing and letting it run on.")
@click.option("--ops", multiple=True, metavar="GLOB",
              help="Record the tensor operations inside the calls of matching modules (recorded "
                   "steps), each with its line of code, e.g. 'layer1*' (repeatable).")
@click.option("--probe", is_flag=True,
              help="Once per model, on a copy: whether one sample's output depends on another "
                   "sample, and whether causal and padding masks keep positions from later or "
                   "padded ones.")
@click.option("--time", is_flag=True,
              help="Time each module call's forward (apart from its children's) and backward in "
                   "the recorded steps: show --sort time, export --format trace.")
@click.argument("target")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def run_command(output: Path, as_module: bool, no_stats: bool, no_watch: bool, target: str,
                args: tuple[str, ...], **flags: Any) -> None:
    """Run the python script TARGET with ARGS, recording every module call to a log."""
    from hooktrace.tracing.target import Target, check_target, misplaced, set_path

    options = TraceOptions.from_flags(**flags, stats=not no_stats, watch=not no_watch,
                                      run="module" if as_module else "script")
    traced = Target(target, args, as_module)
    set_path(traced)
    check_target(traced, output)  # before torch is imported: seconds sooner
    runner = _runner()
    end = runner.run(traced, output, options)
    own = {name for p in click.get_current_context().command.params
           if isinstance(p, click.Option) for name in (*p.opts, *p.secondary_opts)}
    raised = end.error if end.error and end.error.get("type") != "SystemExit" else None
    error = str(raised.get("message", "")) if raised else None  # an exit status says no why
    if end.exit_code and (line := misplaced(traced, own, error)):
        click.echo(f"hooktrace: {line}", err=True)
    sys.exit(end.exit_code)


def _runner() -> Any:
    """The runner module, which imports torch: only ``run`` needs it."""
    try:
        from hooktrace.tracing import runner
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] != "torch":
            raise
        raise _UserError(f"run needs PyTorch, which this Python ({sys.executable}) cannot "
                         "import: pip install torch (any build), or "
                         "pip install 'hooktrace[torch]'") from None
    return runner


@cli.command("render")
@click.argument("logs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--rank", type=int, help="With the logs of several ranks: the rank to draw "
                                       "(default 0).")
@click.option("-o", "--output", type=click.Path(path_type=Path),
              help="Where to write the picture (replaced if it exists). Default: the log's name "
                   "with the format's extension, never over a file hooktrace did not write.")
@click.option("--format", "fmt", metavar="dot|svg|png|pdf",
              help="Default: the extension of -o, else svg. svg/png/pdf need Graphviz dot.")
@click.option("--step", type=int, help="The step (backward pass) to draw. Default: the first "
                                       "with a backward.")
@click.option("--model", metavar="NAME", help="Draw this model only (as named in the log).")
@click.option("--depth", type=click.IntRange(min=0), metavar="D",
              help="Fold calls deeper than D into one node per module at depth D. Default: the "
                   "deepest that keeps the picture readable.")
@click.option("--phase", type=click.Choice(["forward", "backward", "both"]), default="both",
              show_default=True, help="The edges to draw.")
@click.option("--no-findings", is_flag=True,
              help="Do not outline where check finds a problem (saves reading the whole log).")
@_EVERY_CALL
@click.option("--ops", "ops", is_flag=True,
              help="Draw the operations of zoomed calls (run --ops) inside their boxes, each "
                   "with its line.")
def render_command(logs: tuple[Path, ...], rank: int | None, output: Path | None, fmt: str | None,
                   step: int | None, model: str | None, depth: int | None, phase: str,
                   no_findings: bool, every_call: bool, ops: bool) -> None:
    """Draw one step of LOG as a call graph: forward order and backward order. Several logs (or
    a quoted glob) are the ranks of one run: --rank picks the one to draw."""
    from hooktrace.log.discovery import pick_rank
    from hooktrace.show.render import RenderOptions, write_picture

    options = RenderOptions(step=step, model=model, depth=depth, phase=phase,
                            findings=not no_findings, every_call=every_call, ops=ops)
    written = write_picture(pick_rank(logs, rank), output, fmt, options)
    _say(written.picture.warnings, written.summary())
    if elsewhere := written.picture.elsewhere:
        steps = ", ".join(map(str, elsewhere))
        click.echo(f"hooktrace: check finds problems in other steps ({steps}): "
                   f"--step {elsewhere[0]} draws the first", err=True)


@cli.command("show")
@click.argument("log", type=click.Path(path_type=Path))
@click.option("--step", type=int, help="The step (backward pass) to show. Default: the first "
                                       "with a backward.")
@click.option("--phase", type=click.Choice(["forward", "backward", "both"]), default="both",
              show_default=True, help="The events to show.")
@click.option("--model", metavar="NAME", help="Show this model only (as named in the log).")
@click.option("--module", metavar="GLOB",
              help=f"Show the modules whose fqn or class matches only, e.g. 'layer4*' or "
                   f"'Conv2d' ('{ROOT}': a model's root).")
@click.option("--limit", type=click.IntRange(min=0), default=100, show_default=True,
              help="Print at most this many events; 0 prints them all.")
@click.option("--edges", is_flag=True,
              help="Print the edges that render draws instead of the events: forward, from the "
                   "call that made a tensor to each call that used it; backward, the gradient "
                   "back along them.")
@click.option("--depth", type=click.IntRange(min=0), metavar="D",
              help="With --edges: fold calls deeper than D, as render does.")
@click.option("--sort", type=click.Choice(["seq", "time"]), default="seq", show_default=True,
              help="time: the step's calls by their own forward time, longest first.")
def show_command(log: Path, step: int | None, phase: str, model: str | None, module: str | None,
                 limit: int, edges: bool, depth: int | None, sort: str) -> None:
    """Print the events of one step of LOG in order, as an indented table (--edges: the
    edges of its picture)."""
    from hooktrace.show.render.text import show as show_step
    from hooktrace.show.render.text import show_edges

    if depth is not None and not edges:
        raise click.UsageError("--depth folds the edges of --edges; the table has every event")
    if module is not None and edges:
        raise click.UsageError("--module picks rows of the table; --edges shows a whole picture")
    if edges:
        shown = show_edges(log, step, phase, model, depth, limit)
    elif sort == "time":
        from hooktrace.show.render.times import by_time

        shown = by_time(log, step, model, limit, module)
    else:
        shown = show_step(log, step, None if phase == "both" else phase, model, limit, module)
    _say(shown.warnings)
    click.echo(shown.text, nl=False)


@cli.command("check")
@click.argument("logs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the findings as JSON.")
@click.option("--step", type=int, help="Check one step only.")
@click.option("--vanishing", type=float, default=1e-7, show_default=True,
              help="Flag parameter-gradient norms below this.")
@click.option("--exploding", type=float, default=1e4, show_default=True,
              help="Flag parameter-gradient norms above this.")
@click.option("--orders", type=float, default=4.0, show_default=True,
              help="Flag gradient norms that grow or fall by this many orders of magnitude "
                   "across the network.")
def check_command(logs: tuple[Path, ...], as_json: bool, step: int | None, vanishing: float,
                  exploding: float, orders: float) -> None:
    """Find gradient-flow problems in LOGS: NaN/Inf, no gradient, frozen or unused modules,
    vanishing or exploding gradients, and runs that did not finish. Several logs (or a quoted
    glob, 'run.rank*.jsonl') are the ranks of one run: they are also compared step by step.
    Exit status 1 when problems are found."""
    from hooktrace.check import checklog, report
    from hooktrace.check.findings import Thresholds

    result = checklog.run_checks_ranks(logs, step, Thresholds(vanishing, exploding, orders))
    names = " ".join(map(str, logs))
    click.echo(report.to_json(result) if as_json else report.to_text(result, names))
    sys.exit(1 if result.problems else 0)


@cli.command("diff")
@click.argument("a", type=click.Path(path_type=Path))
@click.argument("b", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--step", type=int, help="Compare one step only.")
@click.option("--model", metavar="NAME", help="Compare this model only (as named in the logs).")
@click.option("--rtol", type=click.FloatRange(min=0), default=DEFAULT_RTOL, show_default=True,
              help="Relative tolerance for gradient statistics and parameter-gradient norms "
                   "(the log keeps 4 significant digits).")
@click.option("--atol", type=click.FloatRange(min=0), default=DEFAULT_ATOL, show_default=True,
              help="Absolute tolerance, added to the relative one.")
def diff_command(a: Path, b: Path, as_json: bool, step: int | None, model: str | None, rtol: float,
                 atol: float) -> None:
    """Compare the logs A and B of two runs and report, each from its first difference: what
    ran (calls in one run only, another order), shapes and dtypes, numbers (gradient statistics
    past the tolerance, NaN/Inf in one run only, and how the difference grows), and
    parameter-gradient norms. Calls are matched by model, step, phase, module fqn and call
    index; a module renamed between the runs is matched and reported once. Logs recorded with
    other --steps or --no-stats are compared on what both hold. Exit status 0 when the runs
    agree, 1 when they differ, 2 on bad input."""
    from hooktrace.diff import report as diffreport
    from hooktrace.diff.compare import diff as compare

    report = compare(a, b, step, model, rtol, atol)
    click.echo(diffreport.diff_json(report) if as_json else diffreport.diff_text(report))
    sys.exit(1 if report.differ else 0)


@cli.command("export")
@click.argument("logs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--format", "fmt", metavar="csv|jsonl|trace",
              help="trace: the recorded calls on a time axis, for Perfetto or chrome://tracing "
                   "(docs/timing.md). Default: the extension of -o, else csv.")
@click.option("-o", "--output", metavar="FILE",
              help="Where to write the rows; - for standard output. Default: the log's name "
                   "with the format's extension, never over a file hooktrace did not write.")
def export_command(logs: tuple[Path, ...], fmt: str | None, output: str | None) -> None:
    """Write every event of LOGS as one self-describing row (model, fqn, class, phase, step,
    call, shapes, gradient statistics, NaN/Inf counts) for pandas, DuckDB, a spreadsheet or jq.
    Several logs (or a quoted glob) are the ranks of one run, written rank after rank. The
    columns are listed in docs/reading.md."""
    from hooktrace.show.export import write_rows

    stream = sys.stdout if output == "-" else None
    written = write_rows(logs, fmt, None if stream else output, stream)
    _say(written.warnings, written.summary())


@cli.command("view")
@click.argument("logs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path),
              help="Where to write the page or picture. Default: the log's name with .html, "
                   "or .heatmap.svg / .heatmap.png, never over a file hooktrace did not write.")
@click.option("--format", "fmt", metavar="html|svg|png",
              help="html: the page; svg, png: the heatmap alone, as a picture (needs Graphviz "
                   "dot). Default: the extension of -o, else html.")
@click.option("--values", type=click.Choice(["grad_output", "params"]), default="grad_output",
              show_default=True, help="svg/png: colour by the grad_output norm or by the "
                                      "parameter-gradient norm.")
@click.option("--rank", type=int, help="with the logs of several ranks: the rank svg/png "
                                       "draws and the page opens at (default the first).")
@_EVERY_CALL
def view_command(logs: tuple[Path, ...], output: Path | None, fmt: str | None, values: str,
                 rank: int | None, every_call: bool) -> None:
    """Write one self-contained HTML page to explore LOGS offline: the call graph of each step
    (hover a node for its numbers), a gradient-flow heatmap (modules x steps, colour = log10
    of the gradient norm, NaN/Inf and no-gradient marked) and check's findings, linked to
    both. Several logs (or a quoted glob) are the ranks of one run: a selector picks one.
    --format svg or png writes the heatmap alone, for notebooks and CI artifacts."""
    from hooktrace.show.view import write_view

    written = write_view(logs, output, fmt, values, rank, every_call)
    _say(written.warnings, written.summary())


def _say(warnings: list[str], summary: str | None = None) -> None:
    """A command's warnings, then what it wrote, on stderr (its output may be stdout)."""
    for warning in warnings:
        click.echo(f"hooktrace: warning: {warning}", err=True)
    if summary is not None:
        click.echo(f"hooktrace: {summary}", err=True)


def main() -> None:
    cli(prog_name="hooktrace")
