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
