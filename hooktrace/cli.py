"""The ``hooktrace`` command: parse options, call one library function, print, exit.

Exit status: 0 ok, 1 problems found (``check``), 2 bad input or usage; ``run`` exits with the
script's own status.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from hooktrace import __version__
from hooktrace.errors import HooktraceError
from hooktrace.options import DEFAULT_MAX_EVENTS, Steps, TraceOptions


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


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="hooktrace")
def cli() -> None:
    """Trace the forward and backward order of PyTorch modules, and debug gradient flow."""


@cli.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("-o", "--output", type=click.Path(path_type=Path), default="hooktrace.jsonl",
              show_default=True, help="Where to write the log (JSON lines).")
@click.option("-m", "as_module", is_flag=True, help="Run TARGET as a module, like python -m.")
@click.option("--include", multiple=True, metavar="GLOB",
              help="Record only modules whose fqn matches (repeatable), e.g. 'layer4*'.")
@click.option("--exclude", multiple=True, metavar="GLOB",
              help="Do not record modules whose fqn matches (repeatable).")
@click.option("--steps", metavar="RANGES",
              help="Steps (backward passes) to record, e.g. 0:3 or 0,10:12. Default: all.")
@click.option("--max-events", type=click.IntRange(min=1), default=DEFAULT_MAX_EVENTS,
              show_default=True, help="Stop recording after this many events.")
@click.option("--no-stats", is_flag=True,
              help="Record no gradient norms, NaN/Inf checks or parameter-gradient norms.")
@click.argument("target")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def run(output: Path, as_module: bool, include: tuple[str, ...], exclude: tuple[str, ...],
        steps: str | None, max_events: int, no_stats: bool, target: str,
        args: tuple[str, ...]) -> None:
    """Run the python script TARGET with ARGS, recording every module call to a log."""
    from hooktrace import runner  # imports torch: only this command needs it

    options = TraceOptions(include, exclude, Steps.parse(steps), max_events, not no_stats)
    sys.exit(runner.run(runner.Target(target, args, as_module), output, options))


def main() -> None:
    cli(prog_name="hooktrace")


@cli.command()
@click.argument("log", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the findings as JSON.")
@click.option("--step", type=int, help="Check one step only.")
@click.option("--vanishing", type=float, default=1e-7, show_default=True,
              help="Flag parameter-gradient norms below this.")
@click.option("--exploding", type=float, default=1e4, show_default=True,
              help="Flag parameter-gradient norms above this.")
@click.option("--orders", type=float, default=4.0, show_default=True,
              help="Flag gradient norms that grow or fall by this many orders of magnitude "
                   "across the network.")
def check(log: Path, as_json: bool, step: int | None, vanishing: float, exploding: float,
          orders: float) -> None:
    """Find gradient-flow problems in LOG: NaN/Inf, no gradient, frozen or unused modules,
    vanishing or exploding gradients. Exit status 1 when problems are found."""
    from hooktrace import checks, report

    result = checks.run_checks(log, step, checks.Thresholds(vanishing, exploding, orders))
    click.echo(report.to_json(result) if as_json else report.to_text(result, str(log)))
    sys.exit(1 if result.problems else 0)
