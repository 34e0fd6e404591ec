"""The step, explained: the move itself (issue 36, item 1, expectation ``update``). In recorded
steps on the CPU, the sampled elements of the sampled parameters (``stepcheck.py``'s sample)
are read just before and just after an optimizer's ``step()`` (PyTorch's global step hooks),
with their gradient, their group's hyperparameters and the optimizer's state before the step,
and the move is set against what the optimizer's kind does with them:

* ``SGD``, ``Adam``, ``AdamW`` (PyTorch's own, no hooks of their own, no ``grad_scale``): the
  update modelled exactly, in double (weight decay, L2 or decoupled, momentum and its buffer,
  dampening, nesterov, Adam's moments, bias corrections and amsgrad, ``maximize``, the group's
  lr that step); judged on the elements whose expected move the weight's dtype can show. The step
  contradicts it where the weights did not move at all (``still``), moved against it (cosine
  below -0.5: ``reversed``) or by a hundred times it or more (``scaled``); and, explained or
  not, where the expected move itself climbs the loss: an lr below 0 (``cause`` ``lr``) or
  ``maximize=True`` (``cause`` ``maximize``) on a model's parameters;
* an optimizer class of the user's (not from ``torch.``) that wraps no other optimizer's step:
  only its direction, a move along +g (cosine with -g below -0.5: ``reversed``, ``cause``
  ``custom``);
* any other kind (RMSprop, LBFGS with its closure, ...) is not judged.

A step is skipped where a sampled gradient or weight is not finite. The verdict is kept where
it holds in two recorded steps at least and in half of those judged or more.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from typing import Any

import torch

MODELLED = {"SGD", "Adam", "AdamW"}
COSINE = -0.5  # a move this far against the expected one is reversed
SCALED = 100.0  # a move this many times the expected one is scaled
SHOWN = 8  # an expected move under this many of the weight's dtype's eps times |w| may not show
LISTED = 20

# (parameter, the indices sampled): weak, the sample must keep no model alive
Sampled = list[tuple[weakref.ref[torch.Tensor], torch.Tensor]]
Names = Callable[[list[torch.Tensor]], dict[int, list[str]]]


class _Pending:
    """One parameter's sample just before a step: indices, weights, gradient, hyperparameters,
    state."""

    __slots__ = ("p", "i", "w", "g", "group", "state")

    def __init__(self, p: torch.Tensor, i: torch.Tensor, group: dict[str, Any],
                 state: dict[str, Any]) -> None:
        self.p, self.i = p, i
        self.w = p.detach().reshape(-1)[i].double()
        assert p.grad is not None
        self.g = p.grad.detach().reshape(-1)[i].double()
        self.group = group
        self.state = state


class Moves:
    """The moves of the sampled parameters over recorded steps, per optimizer class: how many
    judged, and those that contradicted what the kind does."""

    def __init__(self, names: Names) -> None:
        self._names = names  # per model, the modules of some parameters
        self._pending: dict[int, tuple[str, list[_Pending]]] = {}  # id(optimizer) -> ...
        self._groups: weakref.WeakKeyDictionary[
            torch.optim.Optimizer, tuple[tuple[int, ...], dict[int, int]]] = (
            weakref.WeakKeyDictionary())
        self.judged: dict[str, int] = {}  # optimizer class -> steps judged
        # (optimizer class, verdict, cause) -> steps (the first LISTED), and how many, the
        # first one's cosine and ratio, lr, and the parameters judged
        self.broken: dict[tuple[str, str, str], list[int]] = {}
        self.counts: dict[tuple[str, str, str], int] = {}
        self.first: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.modules: dict[tuple[str, str, str], dict[int, list[str]]] = {}

    def before(self, optimizer: torch.optim.Optimizer, sampled: Sampled,
               kwargs: dict[str, Any]) -> None:
        if self._pending:  # a step inside another optimizer's (Lookahead): neither judged
            self._pending.clear()
            return
        cls = type(optimizer)
        name = cls.__name__
        custom = not cls.__module__.startswith("torch.")
        modelled = name in MODELLED and cls.__module__.startswith("torch.optim")
        if not sampled or any(v is not None for v in kwargs.values()) or not (
                modelled or custom) or optimizer._optimizer_step_pre_hooks or (
                optimizer._optimizer_step_post_hooks):
            return  # grad_scale (fused), another kind, or hooks of its own that may change it
        group_of = self._group_of(optimizer)
        pending = []
        hyper: dict[int, dict[str, Any]] = {}  # group index -> its hyperparameters now
        for ref, i in sampled:
            p = ref()
            index = None if p is None else group_of.get(id(p))
            if p is None or index is None or p.grad is None or (
                    p.grad.layout is not torch.strided or p.is_complex()
                    or not p.is_floating_point()):
                continue
            if index not in hyper:
                hyper[index] = {k: v for k, v in optimizer.param_groups[index].items()
                                if k != "params"}
            state = {} if custom else _state(optimizer.state.get(p, {}), i)
            pending.append(_Pending(p, i, hyper[index], state))
        if pending and bool(torch.isfinite(torch.cat(
                [t for one in pending for t in (one.w, one.g)])).all()):
            self._pending[id(optimizer)] = ("custom" if custom else name, pending)

    def _group_of(self, optimizer: torch.optim.Optimizer) -> dict[int, int]:
        """id(parameter) -> the index of its param group, kept while the groups stay as many
        and as long."""
        shape = tuple(len(group["params"]) for group in optimizer.param_groups)
        kept = self._groups.get(optimizer)
        if kept is None or kept[0] != shape:
            kept = self._groups[optimizer] = (shape, {
                id(p): index for index, group in enumerate(optimizer.param_groups)
                for p in group["params"]})
        return kept[1]

    def after(self, optimizer: torch.optim.Optimizer, step: int) -> None:
        kind, pending = self._pending.pop(id(optimizer), ("", []))
        if not pending:
            return
        moved = torch.cat([one.p.detach().reshape(-1)[one.i].double() - one.w
                           for one in pending])
        if not bool(torch.isfinite(moved).all()):
            return
        if kind == "custom":
            self._custom(type(optimizer).__name__, pending, moved, step)
        else:
            self._modelled(kind, pending, moved, step)

    def _custom(self, name: str, pending: list[_Pending], moved: torch.Tensor,
                step: int) -> None:
        descent = -torch.cat([one.g for one in pending])
        lr = _float(pending[0].group.get("lr"))
        if not float(descent.abs().sum()) or not float(moved.abs().sum()):
            return
        self.judged[name] = self.judged.get(name, 0) + 1
        cosine = _cosine(moved, descent)
        if cosine < COSINE:
            self._broke((name, "reversed", "custom"), step, pending,
                        {"cosine": cosine, "ratio": 0.0, "lr": lr})

    def _modelled(self, kind: str, pending: list[_Pending], moved: torch.Tensor,
                  step: int) -> None:
        # the parameters of one group with the same state modelled at once, in the same order
        buckets: dict[tuple[Any, ...], list[_Pending]] = {}
        for one in pending:
            key = (id(one.group), one.p.dtype, one.state.get("step"), *sorted(one.state))
            buckets.setdefault(key, []).append(one)
        order = [one for bucket in buckets.values() for one in bucket]
        if order != pending:
            moved = torch.cat([one.p.detach().reshape(-1)[one.i].double() - one.w
                               for one in order])
        expected = torch.cat([_expected(kind, *_merged(bucket)) for bucket in buckets.values()])
        least = torch.cat([torch.cat([one.w for one in bucket]).abs().clamp_min(1e-30) * (
            SHOWN * torch.finfo(bucket[0].p.dtype).eps) for bucket in buckets.values()])
        shown = expected.abs() > least
        if not bool(shown.any()):
            return  # lr 0 (a warmup) or too small a move to see: not judged
        self.judged[kind] = self.judged.get(kind, 0) + 1
        e, m = expected[shown], moved[shown]
        norm_e, norm_m = float(e.norm()), float(m.norm())
        cosine = _cosine(m, e)
        ratio = norm_m / norm_e
        lr = _float(pending[0].group.get("lr"))
        maximize = any(bool(one.group.get("maximize")) for one in pending)
        ascent = "lr" if any(_float(one.group.get("lr")) < 0 for one in pending) else (
            "maximize" if maximize else "")
        detail = {"cosine": cosine, "ratio": ratio, "lr": lr}
        if not float(moved.abs().sum()):
            self._broke((kind, "still", ""), step, pending, detail)
        elif cosine < COSINE:
            self._broke((kind, "reversed", ""), step, pending, detail)
        elif ratio >= SCALED:
            self._broke((kind, "scaled", ""), step, pending, detail)
        elif ascent and cosine > -COSINE:
            self._broke((kind, "reversed", ascent), step, pending, detail)

    def _broke(self, key: tuple[str, str, str], step: int, pending: list[_Pending],
               detail: dict[str, Any]) -> None:
        steps = self.broken.setdefault(key, [])
        if len(steps) < LISTED:
            steps.append(step)
        self.counts[key] = self.counts.get(key, 0) + 1
        self.first.setdefault(key, detail)
        if key not in self.modules:  # named now: the model may be gone when tracing stops
            self.modules[key] = self._names([one.p for one in pending])

    def verdicts(self) -> list[tuple[int, dict[int, list[str]], dict[str, Any]]]:
        """The verdicts that held in two recorded steps or more and in half of those judged:
        (the first step, per model the modules judged, the signal's detail)."""
        out = []
        for key, steps in self.broken.items():
            name, verdict, cause = key
            count, judged = self.counts[key], self.judged.get(name, 0)
            if count < 2 or 2 * count < judged:
                continue
            first = self.first[key]
            out.append((steps[0], self.modules[key], {
                "optimizer": name, "verdict": verdict, "cause": cause, "steps": steps,
                "count": count, "judged": judged, "lr": first["lr"],
                "cosine": round(first["cosine"], 4), "ratio": round(first["ratio"], 4)}))
        return out


def _state(state: dict[str, Any], i: torch.Tensor) -> dict[str, Any]:
    """The sampled elements of a parameter's optimizer state (buffers, moments), its step."""
    out: dict[str, Any] = {}
    for key in ("momentum_buffer", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
        value = state.get(key)
        if isinstance(value, torch.Tensor) and value.layout is torch.strided:
            out[key] = value.detach().reshape(-1)[i].double()
    step = state.get("step")
    out["step"] = _float(step) if step is not None else 0.0
    return out


def _merged(bucket: list[_Pending]) -> tuple[dict[str, Any], dict[str, Any], torch.Tensor,
                                             torch.Tensor]:
    """A bucket's hyperparameters, state, weights and gradient, as one parameter's."""
    if len(bucket) == 1:
        one = bucket[0]
        return one.group, one.state, one.w, one.g
    state = {key: torch.cat([one.state[key] for one in bucket]) if key != "step" else value
             for key, value in bucket[0].state.items()}
    return (bucket[0].group, state, torch.cat([one.w for one in bucket]),
            torch.cat([one.g for one in bucket]))


def _expected(kind: str, h: dict[str, Any], s: dict[str, Any], w: torch.Tensor,
              g: torch.Tensor) -> torch.Tensor:
    """The move PyTorch's ``kind`` makes of the sampled elements, in double."""
    lr, wd = _float(h.get("lr")), _float(h.get("weight_decay", 0.0))
    g = -g if h.get("maximize") else g
    if kind == "SGD":
        g = g + wd * w if wd else g
        momentum = _float(h.get("momentum", 0.0))
        if momentum:
            buf = s.get("momentum_buffer")
            buf = g if buf is None else momentum * buf + (1 - _float(h.get("dampening"))) * g
            g = g + momentum * buf if h.get("nesterov") else buf
        return -lr * g
    decoupled = kind == "AdamW" or bool(h.get("decoupled_weight_decay"))
    start = w * (1 - lr * wd) if decoupled and wd else w
    if wd and not decoupled:
        g = g + wd * w
    beta1, beta2 = (_float(b) for b in h.get("betas", (0.9, 0.999)))
    t = s.get("step", 0.0) + 1
    m = beta1 * s.get("exp_avg", torch.zeros_like(g)) + (1 - beta1) * g
    v = beta2 * s.get("exp_avg_sq", torch.zeros_like(g)) + (1 - beta2) * g * g
    if h.get("amsgrad"):
        v = torch.maximum(s.get("max_exp_avg_sq", torch.zeros_like(g)), v)
    denom = v.sqrt() / math.sqrt(1 - beta2 ** t) + _float(h.get("eps", 1e-8))
    move: torch.Tensor = start - lr / (1 - beta1 ** t) * m / denom - w
    return move


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    norms = float(a.norm()) * float(b.norm())
    return float((a * b).sum()) / norms if norms else 0.0


def _float(value: Any) -> float:
    if isinstance(value, torch.Tensor):
        return float(value.detach().cpu()) if value.numel() == 1 else 0.0
    return float(value) if isinstance(value, (int, float)) else 0.0
