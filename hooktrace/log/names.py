"""What a log's records name, and how fqns nest: the names table a reader keeps (each model's
name, each module's class, where each class's ``forward`` is defined, the models that prepare
data) and a fqn's ancestors. Standard library only."""

from __future__ import annotations

from collections.abc import Iterable, Set
from dataclasses import dataclass, field

from hooktrace.log import schema


def ancestors(name: str) -> list[str]:
    """The fqns of the modules around ``name``, outermost first: "a.b.c" -> ["", "a", "a.b"]."""
    parts = name.split(".") if name else []
    return [".".join(parts[:i]) for i in range(len(parts))]


@dataclass
class LogNames:
    """What a log's records name: each model, each module's class, where each class's
    ``forward`` is defined; which models have parameters. ``take`` each record of a pass."""

    models: dict[int, str] = field(default_factory=dict)
    classes: dict[tuple[int, str], str] = field(default_factory=dict)  # (model, fqn) -> class
    sources: dict[str, str] = field(default_factory=dict)  # class -> "file:line" of forward
    # the models with a module that has parameters
    with_params: set[int] = field(default_factory=set)

    def take(self, record: schema.Record) -> None:
        if isinstance(record, schema.Module):
            self.classes[(record.model, record.fqn)] = record.cls
            if record.params:
                self.with_params.add(record.model)
        elif isinstance(record, schema.Model):
            self.models[record.model] = record.name
        elif isinstance(record, schema.Source):
            self.sources.setdefault(record.cls, f"{record.file}:{record.line}")

    def data_models(self, ran: Iterable[int], reached: Set[int]) -> set[int]:
        """The models that prepare data (torchvision transforms are modules: ``Resize``,
        ``RandomHorizontalFlip``): of the models that ``ran``, those without parameters that no
        backward pass ``reached``; none when no other model ran (a script that only transforms
        data shows its transforms). The caller gives the scope: the models of a whole log and
        the backward passes of every step (``check``, the view page's models and rows), or one
        step's events (a drawn step)."""
        models = set(ran)
        trains = {model for model in models if model in self.with_params or model in reached}
        return models - trains if trains else set()
