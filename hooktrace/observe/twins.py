"""Models of one structure side by side (``twins`` signals, their fields in ``log/signals.py``):
what ``check`` needs to say how an EMA copy, a target network or a teacher relates to the model
it copies. The models are the top-level models the tracer named and, found in the calling
code's variables at a recorded step's optimizer step, modules never called that have one's
structure (an EMA copy kept only to be copied back, ``ema`` beside ``model``). A structure is
the parameters' shapes and dtypes, in order; a model with no twin costs nothing more.

Cost, where there are twins: per recorded step, an integer sum over up to ``SAMPLE`` elements
of each twin's parameters at the pass's end, and the versions of the parameters of those an
optimizer steps, after its step; a look at the calling frames' variables at each recorded
optimizer step. A write through ``.data`` after the step (``p.data.copy_(q)``) leaves no version
behind: a copy made so is seen as the same weights, not as weights replaced. Only where the
parameters are on the CPU (``stats.on_host``).
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any

import torch
from torch import nn

from hooktrace.hooks.naming import ModInfo
from hooktrace.hooks.owners import is_library
from hooktrace.hooks.records import Emit, Mode, Observer, OptimizerStep, PassEnd
from hooktrace.log import schema
from hooktrace.log.schema import SignalKind
from hooktrace.observe.ledger import BITS
from hooktrace.observe.stats import on_host

Structure = tuple[tuple[tuple[int, ...], torch.dtype], ...]
_FRAMES = 4  # the user's calling frames looked at for modules never called


#: elements of a model read for its fingerprint: evenly spaced in each parameter, at most this
#: many in all (at least 16 a parameter)
SAMPLE = 65536


def fingerprint(params: list[torch.Tensor]) -> list[int]:
    """Per element width, the bits of evenly spaced elements of each parameter (``SAMPLE`` in
    all at most), summed (wrapped at their width): an optimizer step or a moving average changes
    it, a copy has the same. Bounded per tensor (a sum over every element of a resnet18 pair
    took 0.5 s a step on a loaded machine), one sum per width (800 small tensors, one each,
    cost more than their elements)."""
    by_width: dict[int, list[torch.Tensor]] = {}
    each = max(16, SAMPLE // max(1, len(params)))
    with torch.no_grad():
        for p in params:
            data = torch.view_as_real(p) if p.is_complex() else p
            flat = data.reshape(-1)
            if flat.numel() > each:
                flat = flat[::flat.numel() // each]
            by_width.setdefault(flat.element_size(), []).append(flat)
        sums = [torch.cat(flats).view(BITS[width]).sum(dtype=BITS[width]).to(torch.int64)
                for width, flats in sorted(by_width.items())]
    return torch.stack(sums).tolist() if sums else []


def _versions(params: list[torch.Tensor]) -> int:
    """The parameters' versions, summed: each in-place write adds one."""
    return sum(p._version for p in params)


def structure(params: Iterable[torch.Tensor]) -> Structure:
    return tuple((tuple(p.shape), p.dtype) for p in params)


class Twins(Observer):
    """Writes a ``twins`` signal per group of models of one structure and recorded step."""

    follows = ()  # no module call: first sights and passes only

    def __init__(self, emit: Emit, known: Callable[[nn.Module], ModInfo | None],
                 model_name: Callable[[int], str]) -> None:
        self._emit = emit
        self._known = known
        self._model_name = model_name
        self._roots: list[ModInfo] = []  # the models' entry modules, as named
        self._loose: dict[str, weakref.ref[nn.Module]] = {}  # never called, by variable
        self._scanned: weakref.WeakSet[nn.Module] = weakref.WeakSet()
        self._last: dict[str, list[int]] = {}  # per model, its fingerprint at the last look
        # per model an optimizer stepped since the last look, its parameters' versions then:
        # an in-place write since (load_state_dict, copy_) adds to them; an update through
        # ``.data`` does not, and is not seen
        self._stepped: dict[str, int] = {}
        self._trained: set[str] = set()  # models an optimizer stepped
        # the twins of the last look: their parameters, by model (held until the next look)
        self._groups: list[dict[str, list[torch.Tensor]]] = []
        self._recorded = False
        self._off = False

    def module_seen(self, module: nn.Module, info: ModInfo) -> None:
        if info.fqn == "":
            self._roots.append(info)

    def backward_end(self, end: PassEnd) -> None:
        self._recorded = end.mode is Mode.RECORDED
        if not self._recorded or self._off:
            return
        try:
            self._look(end.step)
        except Exception:  # never into the program (a sharded or meta parameter): go quiet
            self._quiet()

    def _models(self) -> dict[str, tuple[int | None, nn.Module]]:
        """The models alive with parameters, by name: (model index or None, entry module)."""
        out: dict[str, tuple[int | None, nn.Module]] = {}
        for info in self._roots:
            module = info.ref()
            if module is not None and next(module.parameters(), None) is not None:
                out.setdefault(self._model_name(info.model), (info.model, module))
        for name, ref in self._loose.items():
            module = ref()
            if module is not None:
                out.setdefault(name, (None, module))
        return out

    def _look(self, step: int) -> None:
        if len(self._roots) + len(self._loose) > 1:
            self._roots = [info for info in self._roots if info.ref() is not None]
        models = self._models() if len(self._roots) + len(self._loose) > 1 else {}
        if len(models) < 2:  # one model with parameters (beside a loss module): no twin
            self._groups = []
            self._stepped.clear()
            return
        every: dict[str, list[torch.Tensor]] = {
            name: list(module.parameters()) for name, (_, module) in models.items()}
        by_structure: dict[Structure, list[str]] = {}
        for name, of_model in every.items():
            by_structure.setdefault(structure(of_model), []).append(name)
        self._groups = []
        for names in by_structure.values():
            params = {name: every[name] for name in names}
            if len(names) < 2 or not all(on_host(p) for p in params.values()):
                continue
            self._groups.append(params)
            fingerprints = {name: fingerprint(p) for name, p in params.items()}
            first = next((m for name in names if (m := models[name][0]) is not None), 0)
            versions = {name: _versions(p) for name, p in params.items() if name in self._stepped}
            self._emit(schema.Signal(step, first, "", SignalKind.TWINS,
                                     self._detail(fingerprints, versions)))
            self._last.update(fingerprints)
        self._stepped.clear()

    def _detail(self, fingerprints: dict[str, list[int]], versions: dict[str, int]
                ) -> dict[str, Any]:
        names = list(fingerprints)
        same: dict[tuple[int, ...], list[str]] = {}
        for name, fp in fingerprints.items():
            same.setdefault(tuple(fp), []).append(name)
        detail: dict[str, Any] = {
            "models": names,
            "same": [group for group in same.values() if len(group) > 1],
            "changed": [n for n in names if n in self._last and self._last[n] != fingerprints[n]],
            "unchanged": [n for n in names if self._last.get(n) == fingerprints[n]],
            "trained": [n for n in names if n in self._trained]}
        replaced = [n for n, version in versions.items() if version != self._stepped[n]
                    and len(same[tuple(fingerprints[n])]) > 1]
        if replaced:
            detail["replaced"] = replaced
        return detail

    def optimizer_stepped(self, step: OptimizerStep) -> None:
        if not self._recorded or self._off:
            return
        optimizer = step.optimizer
        try:
            self._scan()
            held = {id(p) for group in optimizer.param_groups for p in group["params"]}
            for group in self._groups:
                for name, params in group.items():
                    if any(id(p) in held for p in params):
                        self._stepped[name] = _versions(params)
                        self._trained.add(name)
        except Exception:  # never into the program: go quiet
            self._quiet()

    def _scan(self) -> None:
        """Modules never called that the calling code holds in a variable, with the structure
        of a model: twins of it (an EMA copy only copied back)."""
        frame: FrameType | None = sys._getframe(1)
        found = 0
        roots: set[Structure] | None = None
        while frame is not None and found < _FRAMES:
            if not is_library(frame.f_code.co_filename):
                found += 1
                for key, value in frame.f_locals.items():
                    if (isinstance(value, nn.Module) and value not in self._scanned
                            and not key.startswith("_") and key != "self"):
                        self._scanned.add(value)
                        if self._known(value) is None and key not in self._loose:
                            if roots is None:
                                roots = {structure(m.parameters()) for info in self._roots
                                         if (m := info.ref()) is not None}
                            if (shape := structure(value.parameters())) in roots and shape:
                                self._loose[key] = weakref.ref(value)
            frame = frame.f_back

    def _quiet(self) -> None:
        self._off = True
        self._groups = []
