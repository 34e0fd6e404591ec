"""Every claim ``check`` makes about gradients over a whole run, held against PyTorch's census
of ``.grad`` (``groundtruth.GradTruth`` with ``watch_optimizers``): after each backward pass
and at each optimizer step.

The claims of single backward passes (the log's backward events, its ``params`` records and
``no-grad`` anomalies, findings that say modules got no or a zero gradient in their steps) are
``groundtruth``'s. Here are those about the run (``RUN_CLAIMS``): parameters ``frozen`` (no
gradient in any pass, none at any optimizer step; "until step N": before it), frozen from a step
on (``frozen-during-run``), the online network a target froze (``shared-target``: none from its
step on), optimizer steps that found every gradient cleared (``grads-cleared``) or zeroed
(``grads-zeroed``), and modules said to get gradients (``weights-unchanged``, ``not-optimized``:
a non-zero one in some pass). A claim's modules are its evidence's ``modules``, else its module
and every module below it that has parameters: how a note is worded or grouped does not matter.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from groundtruth import NONE, NONZERO, ZERO, Census, GradTruth, Truth, _compare, _read, state_of

from hooktrace.check.findings import Finding

#: kind -> (what its modules got, when: "from" its step on, "optimizer" at the optimizer
#: steps after its step, "some" in one pass at least)
RUN_CLAIMS = {"frozen": (NONE, "from"), "frozen-during-run": (NONE, "from"),
              "shared-target": (NONE, "from"), "grads-cleared": (NONE, "optimizer"),
              "grads-zeroed": (ZERO, "optimizer"), "weights-unchanged": (NONZERO, "some"),
              "not-optimized": (NONZERO, "some")}
_SAID = {NONE: "no gradient", ZERO: "an exactly-zero gradient", NONZERO: "a non-zero gradient"}


@dataclass(frozen=True)
class Claim:
    source: str  # the finding, one line
    model: str
    modules: tuple[str, ...]
    state: str
    when: str  # "from", "optimizer" or "some" (RUN_CLAIMS)
    first: int  # the first backward pass it is about
    until: int | None  # the pass it ends before (a frozen note's "until step N")


def claims(findings: Sequence[Finding], modules: Mapping[str, Sequence[str]]) -> list[Claim]:
    """The run-long gradient claims among ``findings``; ``modules``: per model, the fqns the
    census knows, for a finding that names a module with modules below it."""
    out = []
    for f in findings:
        if f.cause not in RUN_CLAIMS:
            continue
        state, when = RUN_CLAIMS[f.cause]
        named = f.evidence.get("modules")
        tops = list(named) if isinstance(named, list) else [f.module]
        known = modules.get(f.model, ())
        # each named module and those below it (a note may name the top of a frozen subtree)
        names = [*dict.fromkeys([n for top in tops for n in known if n == top or not top
                                 or n.startswith(top + ".")] or tops)]
        until = re.search(r"until step (\d+)", f.message)
        out.append(Claim(f"check [{f.cause}] {f.severity} {f.module or '(root)'}: {f.message}",
                         f.model, tuple(names), state, when,
                         f.step if f.step is not None and f.cause != "frozen" else 0,
                         int(until.group(1)) if until else None))
    return out


def _merged(*found: Truth | None) -> Truth | None:
    grads = {k: v for t in found if t is not None for k, v in t.grads.items()}
    return Truth(grads, frozenset(), False) if grads else None


def _at(census: Sequence[Census], frozen: Sequence[Census], i: int, key: tuple[int, str]
        ) -> Truth | None:
    return _merged(census[i].get(key), frozen[i].get(key) if i < len(frozen) else None)


def _held(claim: Claim, model: int, truth: GradTruth) -> list[str]:
    """What PyTorch says against ``claim``, one line each."""
    passes = range(claim.first, len(truth.steps) if claim.until is None else claim.until)
    seen: list[tuple[str, str, Truth]] = []  # (module, where, truth)
    for name in claim.modules:
        key = (model, name)
        if claim.when != "optimizer":
            seen += [(name, f"backward pass {i}", t) for i in passes
                     if (t := _at(truth.steps, truth.frozen, i, key)) is not None]
        if claim.when != "some":
            seen += [(name, f"the optimizer step after pass {after - 1}", t)
                     for after, census in truth.optimizer_steps
                     if after - 1 in passes and (t := census.get(key)) is not None]
    if claim.when == "some":
        if not seen or any(t.state == NONZERO for _, _, t in seen):
            return []
        return [f"{claim.source}: says {_SAID[NONZERO]}; PyTorch: {_SAID[NONE]} or zero in "
                f"every pass ({', '.join(claim.modules)})"]
    return [f"{claim.source}: says {_SAID[claim.state]}; PyTorch at {where}, {name}: "
            f"{t.text()}" for name, where, t in seen if _wrong(claim.state, t)]


def _wrong(said: str, t: Truth) -> bool:
    state = state_of(list(t.grads.values()))
    return state == NONZERO if said != NONZERO else state != NONZERO


def disagreements(path: str | os.PathLike[str], findings: Sequence[Finding],
                  truth: GradTruth) -> list[str]:
    """Every claim about gradients of the log at ``path`` and of ``findings`` (check's, on
    it) that the census ``truth`` (recorded in the same run) contradicts: groundtruth's per
    backward pass, and the run-long ones. A log model is the case model of its class."""
    read = _read(path, truth.layout, scoped=False, by_class=True)
    out = [f"{c}" for c in _compare(read, findings, truth)]
    known = {name: sorted({n for census in (*truth.steps, *truth.frozen) for i, n in census
                           if i == model}) for name, model in read.by_name.items()}
    for claim in claims(findings, known):
        model = read.by_name.get(claim.model)
        if model is not None:
            out += _held(claim, model, truth)
    return out
