"""The step, explained: the move itself. In recorded steps on the CPU, the sampled elements of
the sampled parameters (``stepcheck.py``'s sample) are read just before and just after an
optimizer's ``step()`` (PyTorch's global step hooks), with their gradient, their group's
hyperparameters and the optimizer's state before the step, and the move is set against what
the optimizer's kind does with them (facts per judged step: ``check/stepexplained.py`` says
which contradict the kind):

* ``SGD``, ``Adam``, ``AdamW`` (PyTorch's own, no hooks of their own, no ``grad_scale``): the
  update modelled exactly, in double (weight decay, L2 or decoupled, momentum and its buffer,
  dampening, nesterov, Adam's moments, bias corrections and amsgrad, ``maximize``, the group's
  lr that step), on the elements whose expected move the weight's dtype can show: the cosine of
  the move with it, the ratio of their norms, whether the weights moved at all, and whether the
  expected move itself climbs the loss (an lr below 0: ``lr``; ``maximize=True``: ``maximize``);
* an optimizer class of the user's (not from ``torch.``) that wraps no other optimizer's step:
  the cosine of the move with -g (``custom``);
* any other kind (RMSprop, LBFGS with its closure, ...) is not judged.

A step is not judged where a sampled gradient or weight is not finite.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from typing import Any

import torch

MODELLED = {"SGD", "Adam", "AdamW"}
SHOWN = 8  # an expected move under this many of the weight's dtype's eps times |w| may not show
LISTED = 64  # judged steps listed per optimizer class

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
    """The moves of the sampled parameters over recorded steps, per optimizer class: per judged
    step (the first ``LISTED``), [step, cosine, ratio, lr, moved, ascent]; how many judged; per
    model the modules judged at the first."""

    def __init__(self, names: Names) -> None:
        self._names = names  # per model, the modules of some parameters
        self._pending: dict[int, tuple[str, list[_Pending]]] = {}  # id(optimizer) -> ...
        self._groups: weakref.WeakKeyDictionary[
            torch.optim.Optimizer, tuple[tuple[int, ...], dict[int, int]]] = (
            weakref.WeakKeyDictionary())
        self.judged: dict[str, int] = {}  # optimizer class -> steps judged
        self.steps: dict[str, list[list[Any]]] = {}
        self.modules: dict[str, dict[int, list[str]]] = {}

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
        if not float(descent.abs().sum()) or not float(moved.abs().sum()):
            return
        lr = _float(pending[0].group.get("lr"))
        self._judged(name, step, pending, [_cosine(moved, descent), 0.0, lr, True, "custom"])

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
        e, m = expected[shown], moved[shown]
        ratio = float(m.norm()) / float(e.norm())
        ascent = "lr" if any(_float(one.group.get("lr")) < 0 for one in pending) else (
            "maximize" if any(bool(one.group.get("maximize")) for one in pending) else "")
        self._judged(kind, step, pending, [_cosine(m, e), ratio, _float(
            pending[0].group.get("lr")), bool(float(moved.abs().sum())), ascent])

    def _judged(self, name: str, step: int, pending: list[_Pending], fact: list[Any]) -> None:
        self.judged[name] = self.judged.get(name, 0) + 1
        steps = self.steps.setdefault(name, [])
        if len(steps) < LISTED:
            steps.append([step, round(fact[0], 4), round(fact[1], 4), *fact[2:]])
        if name not in self.modules:  # named now: the model may be gone when tracing stops
            self.modules[name] = self._names([one.p for one in pending])

    def facts(self, model: int) -> list[dict[str, Any]]:
        """The moves judged of the optimizer classes that held modules of ``model``."""
        return [{"optimizer": name, "judged": self.judged[name], "steps": steps,
                 "modules": self.modules[name][model]}
                for name, steps in self.steps.items() if model in self.modules[name]]


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
