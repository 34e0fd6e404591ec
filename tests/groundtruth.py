"""The ground-truth invariant: what a log says about gradient arrival, held against PyTorch's own
answer for the same step (each trainable module's ``param.grad`` after ``backward()``).

A case is traced in-process (``run_case``): each step runs its forward and backward, then
``GradTruth.record`` reads every trainable module's own parameters' ``.grad`` (None, all zero,
non-zero), then the case's update (optimizer step, ``zero_grad``). ``contradictions`` compares
that with every claim the log makes about gradient arrival:

* its backward events: a module that ran forward in a step and whose calls got no gradient back
  (no backward event, or no gradient at any output), or an exactly-zero one, or a non-zero one;
* its ``params`` records (the norm of each module's own parameters' ``.grad``) and its
  ``no-grad`` anomalies;
* ``check``'s findings that name modules as getting no gradient or a zero one (``no-grad``,
  ``no-grad-under-no_grad``, ``zero-gradient``, ``dead-activation``, a boundary's starved
  modules, ``unused`` trainable modules, ``never-reached`` models).

Over a whole run (``watch_optimizers``), the census also reads every ``.grad`` at each optimizer
step (what the step applied: after gradient accumulation, after ``zero_grad`` by mistake);
``tests/truthclaims.py`` holds ``check``'s claims about the whole run against both.

A contradiction is a claim of no (or zero) gradient where a ``param.grad`` is non-zero, or the
reverse. Parameters shared by several modules are left out of the event comparison (a module's
own calls need not carry their gradient), not out of the ``params`` record's.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_pre_hook

import hooktrace
from hooktrace.check.checklog import run_checks
from hooktrace.check.findings import Finding, Report
from hooktrace.log import schema
from hooktrace.log.reader import LogReader

NONE, ZERO, NONZERO = "none", "zero", "nonzero"
ModuleKey = tuple[int, str]  # (index of the model in the case's models, fqn)
Layout = list[tuple[str, frozenset[str]]]  # per case model: its class, its modules' fqns

#: finding kinds that say their modules got no gradient ("none") or an exactly-zero one
CLAIMS = {"no-grad": NONE, "no-grad-under-no_grad": NONE, "unused": NONE, "never-reached": NONE,
          "zero-gradient": ZERO, "dead-activation": ZERO}
_SAID = {NONE: "no gradient", ZERO: "an exactly-zero gradient", NONZERO: "a non-zero gradient"}


def state_of(norms: Sequence[float | None]) -> str:
    """none: no parameter has a .grad; zero: every .grad is all zeros; else nonzero (NaN/Inf
    count as non-zero: a gradient arrived)."""
    got = [n for n in norms if n is not None]
    if not got:
        return NONE
    return ZERO if all(n == 0 for n in got) else NONZERO


def _norm(norms: Sequence[float | None]) -> float | None:
    got = [n for n in norms if n is not None]
    return math.sqrt(sum(n * n for n in got)) if got else None


@dataclass(frozen=True)
class Truth:
    """One module's own trainable parameters after one backward pass: ``.grad`` norm each."""

    grads: dict[str, float | None]  # parameter name -> norm of its .grad, None without one
    shared: frozenset[str]  # parameters some other module holds too
    leaf: bool  # a module without children

    @property
    def state(self) -> str:
        return state_of(list(self.grads.values()))

    @property
    def own_state(self) -> str:
        """As ``state``, of the parameters no other module holds (what its calls carry)."""
        return state_of([v for k, v in self.grads.items() if k not in self.shared])

    @property
    def norm(self) -> float | None:
        return _norm(list(self.grads.values()))

    def text(self) -> str:
        shown = ", ".join(f"{k} {'None' if v is None else f'{v:.3g}'}"
                          for k, v in list(self.grads.items())[:4])
        more = f", ... ({len(self.grads)} parameters)" if len(self.grads) > 4 else ""
        return f"param.grad {self.state} (norm {_fmt(self.norm)}: {shown}{more})"


def _fmt(norm: float | None) -> str:
    return "None" if norm is None else f"{norm:.3g}"


Census = dict[ModuleKey, Truth]


class GradTruth:
    """PyTorch's answer for each backward pass: ``record()`` right after ``backward()``; and,
    once ``watch_optimizers()`` ran, at each optimizer step (``optimizer_steps``: the backward
    passes done by then, and the census)."""

    def __init__(self, models: Sequence[nn.Module]) -> None:
        self.models = list(models)
        self.layout: Layout = _layout(self.models)
        self.steps: list[Census] = []
        # per backward pass, the parameters that required no gradient (a frozen module's
        # .grad is None: what a claim that it got none is held against)
        self.frozen: list[Census] = []
        # per optimizer step, the backward passes done by then, and every parameter's .grad
        self.optimizer_steps: list[tuple[int, Census]] = []
        self._hook: torch.utils.hooks.RemovableHandle | None = None
        owners: dict[int, int] = {}
        for model in self.models:
            for _, module in model.named_modules():
                for p in module.parameters(recurse=False):
                    owners[id(p)] = owners.get(id(p), 0) + 1
        self._owners = owners

    def watch_optimizers(self) -> None:
        """Take the census at every optimizer step from now on (a global step pre hook, removed
        by ``save``)."""
        def stepping(*_: object) -> None:
            self.optimizer_steps.append((len(self.steps), self._census(trainable=None)))

        self._hook = register_optimizer_step_pre_hook(stepping)

    def record(self) -> None:
        self.steps.append(self._census())
        self.frozen.append(self._census(trainable=False))

    def _census(self, trainable: bool | None = True) -> Census:
        """Per module, its own parameters that require a gradient (``trainable``), those that
        do not (False), or all of them (None)."""
        found: Census = {}
        for index, model in enumerate(self.models):
            for fqn, module in model.named_modules():
                params = [(n, p) for n, p in module.named_parameters(recurse=False)
                          if trainable is None or p.requires_grad == trainable]
                if params:
                    found[(index, fqn)] = Truth(
                        {n: None if p.grad is None else float(p.grad.detach().double().norm())
                         for n, p in params},
                        frozenset(n for n, p in params if self._owners.get(id(p), 0) > 1),
                        not any(True for _ in module.children()))
        return found

    def save(self, path: str | os.PathLike[str]) -> None:
        """What was recorded, as JSON: a script under ``hooktrace run`` hands it to the test.
        The layout is taken now: modules made during the run (a target built at the first
        forward) are in it."""
        if self._hook is not None:
            self._hook.remove()
        if self.models:
            self.layout = _layout(self.models)

        def rows(census: Census) -> list[list[object]]:
            return [[i, n, t.grads, sorted(t.shared), t.leaf] for (i, n), t in census.items()]

        Path(path).write_text(json.dumps({
            "layout": [[c, sorted(n)] for c, n in self.layout],
            "steps": [rows(s) for s in self.steps],
            "frozen": [rows(s) for s in self.frozen],
            "optimizer_steps": [[after, rows(s)] for after, s in self.optimizer_steps]}))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> GradTruth:
        data = json.loads(Path(path).read_text())
        truth = cls([])
        truth.layout = [(c, frozenset(n)) for c, n in data["layout"]]

        def census(rows: list[list[object]]) -> Census:
            return {(i, n): Truth(grads, frozenset(shared), leaf)  # type: ignore[misc]
                    for i, n, grads, shared, leaf in rows}

        truth.steps = [census(s) for s in data["steps"]]
        truth.frozen = [census(s) for s in data.get("frozen", [])]
        truth.optimizer_steps = [(after, census(s))
                                 for after, s in data.get("optimizer_steps", [])]
        return truth


def _layout(models: Sequence[nn.Module]) -> Layout:
    return [(type(m).__name__, frozenset(n for n, _ in m.named_modules())) for m in models]


@dataclass(frozen=True)
class Contradiction:
    step: int
    module: str  # "model:fqn"
    source: str  # what in the log made the claim
    claim: str
    truth: str

    def __str__(self) -> str:
        return (f"step {self.step} {self.module}: {self.source} says {self.claim}; "
                f"PyTorch: {self.truth}")


@dataclass
class _Claims:
    """What one log says, keyed by the case's model index."""

    models: dict[int, str] = field(default_factory=dict)  # case index -> the log's model name
    by_name: dict[str, int] = field(default_factory=dict)  # the log's model name -> case index
    calls: dict[tuple[int, ModuleKey], str] = field(default_factory=dict)  # events, per step
    params: dict[tuple[int, ModuleKey], float | None] = field(default_factory=dict)
    anomalies: set[tuple[int, ModuleKey]] = field(default_factory=set)
    steps: int = 0


def _map_models(records: list[schema.Model], fqns: dict[int, set[str]], layout: Layout,
                scoped: bool, by_class: bool = False) -> dict[int, int]:
    """The log's model index -> the case's. Traced with ``model=`` they are the same; traced
    whole, a log model is the case model of its class (it must be the only one of it) whose
    modules it names; ``by_class``: of its class alone (modules made in ``forward`` have names
    the case's tree does not know: those are not compared), several of one class in the order
    the program first called them."""
    if scoped:
        return {r.model: r.model for r in records}
    out: dict[int, int] = {}
    for r in records:
        same = [i for i, (cls, names) in enumerate(layout) if cls == r.cls
                and (by_class or fqns.get(r.model, set()) <= names)
                and i not in out.values()]
        if len(same) > 1 and not by_class:
            raise ValueError(f"several models of class {r.cls}: trace them with model=[...]")
        if same:
            out[r.model] = same[0]
    return out


def _read(path: str | os.PathLike[str], layout: Layout, scoped: bool,
          by_class: bool = False) -> _Claims:
    reader = LogReader(path)
    records = list(reader)
    model_records = [r for r in records if isinstance(r, schema.Model)]
    fqns: dict[int, set[str]] = {}
    for r in records:
        if isinstance(r, schema.Module):
            fqns.setdefault(r.model, set()).add(r.fqn)
    index = _map_models(model_records, fqns, layout, scoped, by_class)
    claims = _Claims()
    for r in model_records:
        if r.model in index:
            claims.models[index[r.model]] = r.name
            claims.by_name[r.name] = index[r.model]
    for r in records:
        if isinstance(r, (schema.ForwardEvent, schema.BackwardEvent)) and r.model in index:
            at = (r.step, (index[r.model], r.fqn))
            said = claims.calls.setdefault(at, NONE)
            if isinstance(r, schema.BackwardEvent):
                claims.calls[at] = _merge(said, _arrived(r))
        elif isinstance(r, schema.ParamGrads) and r.model in index:
            for name, norm in r.grad_norm.items():
                claims.params[(r.step, (index[r.model], name))] = norm
        elif isinstance(r, schema.Anomaly) and r.kind == "no-grad" and r.model in index:
            claims.anomalies.add((r.step, (index[r.model], r.fqn)))
        elif isinstance(r, schema.End):
            claims.steps = r.steps
    return claims


def _arrived(e: schema.BackwardEvent) -> str:
    if e.grad_output_stats is not None:
        norms = [s[0] for s in e.grad_output_stats if s is not None]
        return state_of(norms)
    return NONZERO if any(s is not None for s in e.grad_output_shapes) else NONE


def _merge(a: str, b: str) -> str:
    order = [NONE, ZERO, NONZERO]
    return order[max(order.index(a), order.index(b))]


def _got(state: str) -> bool:
    return state == NONZERO


def contradictions(path: str | os.PathLike[str], findings: Sequence[Finding], truth: GradTruth,
                   scoped: bool = True) -> list[Contradiction]:
    """Every claim of the log at ``path`` and of ``findings`` (check's, on that log) that
    ``truth`` (recorded in the same run) contradicts."""
    return _compare(_read(path, truth.layout, scoped), findings, truth)


def _compare(claims: _Claims, findings: Sequence[Finding], truth: GradTruth
             ) -> list[Contradiction]:
    out: list[Contradiction] = []

    def label(key: ModuleKey) -> str:
        return f"{claims.models.get(key[0], key[0])}:{key[1] or '(root)'}"

    if claims.steps != len(truth.steps):
        out.append(Contradiction(-1, "", "the end record", f"{claims.steps} backward passes",
                                 f"{len(truth.steps)} recorded"))
    for (step, key), said in sorted(claims.calls.items()):
        t = truth.steps[step].get(key) if step < len(truth.steps) else None
        if t is None or t.shared == frozenset(t.grads):
            continue
        # no gradient at its outputs: none for its own parameters. The reverse holds only for
        # a leaf's .grad being None: a non-zero output gradient can leave a parameter's at zero
        # (a zero input, a zero-initialised layer after it inside the module: ViT's head)
        if (not _got(said) and _got(t.own_state)) or (
                said == NONZERO and t.leaf and t.own_state == NONE):
            out.append(Contradiction(step, label(key), "its backward events", _SAID[said],
                                     t.text()))
    for (step, key), norm in sorted(claims.params.items(), key=lambda kv: kv[0]):
        t = truth.steps[step].get(key) if step < len(truth.steps) else None
        if t is None:
            continue
        said = state_of([norm])
        if said != t.state or not _close(norm, t.norm):
            out.append(Contradiction(step, label(key), "its params record",
                                     f"{_SAID[said]} (norm {_fmt(norm)})", t.text()))
    for step, key in sorted(claims.anomalies):
        t = truth.steps[step].get(key) if step < len(truth.steps) else None
        if t is not None and _got(t.state):
            out.append(Contradiction(step, label(key), "a no-grad anomaly", _SAID[NONE],
                                     t.text()))
    for f in findings:
        out += _finding_contradictions(f, claims, truth, label)
    return out


def _close(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    if not (math.isfinite(a) and math.isfinite(b)):
        return not math.isfinite(a) and not math.isfinite(b)
    # the log's norms are float32 sums: torch's float32 norm of 103M normal values is 1.1% below
    # the float64 one (vgg11_bn's classifier.0 logs 57.5 for 57.7)
    return math.isclose(a, b, rel_tol=5e-2, abs_tol=1e-12)


def _finding_contradictions(f: Finding, claims: _Claims, truth: GradTruth,
                            label: Callable[[ModuleKey], str]) -> list[Contradiction]:
    """A finding that says its modules got no (or a zero) gradient in its steps: for one
    module, in each of them; for several (the steps are their union), in one at least."""
    said = CLAIMS.get(f.cause)
    model = claims.by_name.get(f.model)
    if said is None or model is None:
        return []
    ev = f.evidence
    all_steps = list(range(len(truth.steps)))
    steps = [s for s in ev.get("steps") or ([f.step] if f.step is not None else all_steps)
             if s < len(truth.steps)]
    source = f"check [{f.cause}] {f.severity}: {f.message}"
    if "params" in ev and f.cause == "no-grad":  # named parameters of one module got none
        t = truth.steps[steps[0]].get((model, f.module)) if steps else None
        got = [p for p in ev["params"] if t is not None and t.grads.get(p)]
        return [Contradiction(steps[0], label((model, f.module)), source,
                              f"{', '.join(got)} got {_SAID[said]}", t.text())] if t and got else []
    if "starved" in ev:
        names = list(ev["starved"])
    elif "modules" in ev and isinstance(ev["modules"], list):
        names = list(ev["modules"])
    elif f.cause in ("unused", "never-reached") or not (f.module or ev):
        # the module and everything below it (a whole model, named by its root)
        names = [n for (i, n) in truth.steps[0] if i == model and (
            not f.module or n == f.module or n.startswith(f.module + "."))] if truth.steps else []
        steps = all_steps
    else:
        names = [f.module]
    out = []
    for name in names:
        key = (model, name)
        wrong = [s for s in steps if (t := truth.steps[s].get(key)) is not None and _got(t.state)]
        if wrong and (len(names) == 1 or len(wrong) == len(steps)):
            out.append(Contradiction(wrong[0], label(key), source, _SAID[said],
                                     truth.steps[wrong[0]][key].text()))
    return out


@dataclass
class Case:
    """A healthy training program: ``backward()`` runs one step's forward and backward,
    ``update()`` what follows (optimizer step, zero_grad). ``models`` are compared with the log;
    ``scoped``: trace only them (``model=``), else every module call (data transforms too)."""

    models: list[nn.Module]
    backward: Callable[[], None]
    update: Callable[[], None]
    scoped: bool = True


@dataclass
class Result:
    report: Report
    contradictions: list[Contradiction]
    seconds: float
    models: list[str]  # the log's names of the case's models

    @property
    def problems(self) -> list[str]:
        """check's warnings and errors (what makes it exit 1), one line each."""
        return [f"[{f.cause}] {f.severity} {f.model}:{f.module or '(root)'}: {f.message}"
                for f in self.report.problems]

    def failures(self) -> list[str]:
        """What makes a healthy case fail: problems, reading warnings, contradictions."""
        return (self.problems + [f"log: {w}" for w in self.report.warnings]
                + [f"contradiction: {c}" for c in self.contradictions])


def run_case(path: str | os.PathLike[str], case: Case, steps: int) -> Result:
    """Trace ``steps`` steps of ``case`` into ``path``, check the log, compare it with PyTorch."""
    truth = GradTruth(case.models)
    start = time.perf_counter()
    with hooktrace.trace(path, model=case.models if case.scoped else None):
        for _ in range(steps):
            case.backward()
            truth.record()
            case.update()
    report = run_checks(path)
    claims = _read(path, truth.layout, case.scoped)
    found = _compare(claims, report.findings, truth)
    return Result(report, found, time.perf_counter() - start, list(claims.models.values()))


def check_run(path: str | os.PathLike[str], truth_path: str | os.PathLike[str]) -> Result:
    """Check the log ``hooktrace run`` wrote of a script that saved its ``GradTruth`` (every
    module call traced, from the models' construction on), compare it with PyTorch."""
    start = time.perf_counter()
    truth = GradTruth.load(truth_path)
    report = run_checks(path)
    claims = _read(path, truth.layout, scoped=False)
    found = _compare(claims, report.findings, truth)
    return Result(report, found, time.perf_counter() - start, list(claims.models.values()))


def sgd(models: Sequence[nn.Module], lr: float = 1e-3) -> Callable[[], None]:
    """The usual update: an SGD step, then ``zero_grad(set_to_none=True)``."""
    params = [p for m in models for p in m.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=lr)

    def update() -> None:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return update
