"""Who may see whom (``--probe``): on a copy of a model and a detached copy of one call's
input, vector-Jacobian products say whether the output for one sample depends on another
sample, whether a masked attention module lets position t see later positions, and whether the
output depends on padded positions. Returns facts (dicts); ``check`` judges them.

What it measures, each with ``torch.autograd.grad`` on the copy's own graph (``v`` drawn from
a private generator; a dependence is a gradient above 1e-6 of the largest one):

* ``batch``: for samples 0 and n-1 of the output's first axis, which samples of the input they
  depend on, along the input axis of the same size where they depend on the fewest (the batch
  axis); the copy's BatchNorm layers in train mode are listed (they mix samples by design);
* ``causal``: for attention modules (``MultiheadAttention``, ``Transformer*``, the outermost
  of a nest) called with a mask that orders positions (a triangular ``attn_mask``/``mask``,
  ``is_causal=True``) or inside a model fed ``x[:, :-1]`` (next-step prediction), whether the
  output at positions 0 and T/2 depends on later positions of the module's own input;
* ``padding``: where positions are padded (the ids equal to the ``padding_idx`` of the
  ``Embedding`` that reads them, right- or left-aligned; else a ``key_padding_mask``), whether
  the output at real positions depends on padded ones, and whether each attention module's
  ``key_padding_mask`` says the same positions are padded.

The copy's dropout (``Dropout`` layers, ``MultiheadAttention``'s) is off; everything runs in
``fork_rng``, so the program's weights, generators, gradients and outputs are as they were.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.dropout import _DropoutNd
from torch.utils._pytree import tree_flatten, tree_map

from hooktrace.observe.twin import twin_of

ATTENTION = (nn.MultiheadAttention, nn.TransformerEncoder, nn.TransformerEncoderLayer,
             nn.TransformerDecoder, nn.TransformerDecoderLayer, nn.Transformer)
TOL = 1e-6  # a dependence: a gradient above this share of the largest one
Fact = dict[str, Any]


class _Seen:
    """What the copy's hooks saw in its forward: the leaves to differentiate by, and each
    outermost attention module's input leaf, output, layout and mask arguments."""

    def __init__(self) -> None:
        self.embedded: list[torch.Tensor] = []  # ids' embeddings + a zero leaf
        self.pad_idx: int | None = None
        self.attention: dict[str, dict[str, Any]] = {}


def probe(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Fact]:
    """The facts about ``model`` called with ``args``, ``kwargs`` (measured on copies)."""
    # the input: the first positional argument (key None), else the first keyword argument
    # that is a tensor (``input_ids=``)
    key = None if args else next((k for k, v in kwargs.items() if isinstance(v, torch.Tensor)),
                                 None)
    x = args[0] if key is None else kwargs.get(key)
    if not isinstance(x, torch.Tensor) or x.ndim < 1:
        return [{"what": "undecided", "why": "its first input is not a tensor"}]
    try:
        twin = twin_of(model)
    except Exception as e:
        return [{"what": "undecided", "why": f"the model could not be copied ({type(e).__name__})"}]
    devices = sorted({t.device.index or 0 for t in tree_flatten((args, kwargs))[0]
                      if isinstance(t, torch.Tensor) and t.device.type == "cuda"})
    with torch.random.fork_rng(devices=devices), torch.enable_grad():
        return _probe(twin, x, key, args, kwargs)


_HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks",
               "_backward_pre_hooks")


def _drop_user_hooks(m: nn.Module) -> None:
    """The copy's module hooks of the user's code removed (a copy runs the same functions: a
    hook that counts or collects would count the probe's call); torch's own (weight_norm,
    spectral_norm, pruning) kept, as they make the weights."""
    for attr in _HOOK_DICTS:
        hooks = getattr(m, attr, None)
        if not hooks:
            continue
        for key, hook in list(hooks.items()):
            owner = getattr(hook, "__module__", None) or type(hook).__module__
            if not owner.startswith("torch"):
                del hooks[key]


def _probe(twin: nn.Module, x: torch.Tensor, key: str | None, args: tuple[Any, ...],
           kwargs: dict[str, Any]) -> list[Fact]:
    for m in twin.modules():
        if isinstance(m, (_DropoutNd, nn.MultiheadAttention)):
            m.eval()  # only their dropout changes; BatchNorm keeps its mode
        _drop_user_hooks(m)
    args, kwargs = tree_map(lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t,
                            (args, kwargs))
    inp = args[0] if key is None else kwargs[key]
    floating = x.is_floating_point()
    leaf = inp.requires_grad_() if floating else None
    seen = _Seen()
    handles = _hook(twin, inp, seen, floating)
    try:
        y = _first_float(twin(*args, **kwargs))
    finally:
        for h in handles:
            h.remove()
    leaves = [leaf] if leaf is not None else seen.embedded
    if y is None or not leaves:
        why = ("no floating output depends on its input" if y is None else
               "its input is ids no Embedding reads")
        return [{"what": "undecided", "why": why}]
    gen = torch.Generator().manual_seed(1234)
    facts = [_batch(y, leaves, x.shape, gen, twin)]
    shifted = _shifted_axis(x)
    facts += _causal(seen, shifted is not None, gen)
    padded = _padded(x, seen)
    if padded is not None:
        facts.append(_padding(y, leaves, *padded, seen, gen))
    return [f for f in facts if f]


def _first_float(out: Any) -> torch.Tensor | None:
    for t in tree_flatten(out)[0]:
        if (isinstance(t, torch.Tensor) and t.is_floating_point() and t.requires_grad
                and t.ndim > 0):  # not a loss the model returns too
            return t
    return None


def _hook(twin: nn.Module, ids: torch.Tensor, seen: _Seen, floating: bool) -> list[Any]:
    """Hooks on the copy: ids' embeddings made leaves (+ a zero), outermost attention modules'
    first inputs made leaves, their outputs and mask arguments kept."""
    handles: list[Any] = []
    outer = _outermost(twin)
    for name, m in twin.named_modules():
        if not floating and isinstance(m, nn.Embedding):
            handles.append(m.register_forward_hook(_embedding_hook(m, ids, seen)))
        if name in outer:
            pre, post = _attention_hooks(name, m, seen)
            handles.append(m.register_forward_pre_hook(pre, with_kwargs=True))
            handles.append(m.register_forward_hook(post))
    return handles


def _outermost(twin: nn.Module) -> set[str]:
    names = [n for n, m in twin.named_modules() if isinstance(m, ATTENTION)]
    return {n for n in names if not any(n.startswith(f"{o}.") or (o == "" and n) for o in names
                                        if o != n)}


def _embedding_hook(m: nn.Embedding, ids: torch.Tensor, seen: _Seen) -> Callable[..., Any]:
    def hook(module: nn.Module, inputs: tuple[Any, ...], out: Any) -> Any:
        if not inputs or not isinstance(inputs[0], torch.Tensor) or inputs[0].shape != ids.shape:
            return None
        if seen.pad_idx is None and m.padding_idx is not None:
            seen.pad_idx = m.padding_idx
        delta = torch.zeros_like(out, requires_grad=True)
        seen.embedded.append(delta)
        return out + delta
    return hook


def _attention_hooks(name: str, m: nn.Module, seen: _Seen
                     ) -> tuple[Callable[..., Any], Callable[..., Any]]:
    signature = inspect.signature(m.forward)

    def pre(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if name in seen.attention:
            return None  # a second call: the first one is measured
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:
            return None
        values = list(bound.arguments.items())
        # the input whose positions a causal mask orders: a decoder's tgt (nn.Transformer's
        # first is its encoder's src), else the first
        first = bound.arguments.get("tgt", values[0][1] if values else None)
        if not isinstance(first, torch.Tensor) or not first.is_floating_point():
            return None
        delta = torch.zeros_like(first, requires_grad=True)
        moved = first + delta
        for key, value in values:
            if value is first:
                bound.arguments[key] = moved
        masks = {k: v for k, v in values
                 if ("mask" in k and v is not None) or k.endswith("is_causal")}
        seen.attention[name] = {"delta": delta, "masks": masks,
                                "batch_first": _batch_first(module)}
        return bound.args, bound.kwargs

    def post(module: nn.Module, args: tuple[Any, ...], out: Any) -> None:
        entry = seen.attention.get(name)
        if entry is not None and "out" not in entry:
            entry["out"] = _first_float(out)
    return pre, post


def _batch_first(m: nn.Module) -> bool:
    for sub in m.modules():
        if isinstance(sub, nn.MultiheadAttention):
            return bool(sub.batch_first)
    return bool(getattr(m, "batch_first", False))


def _grad(y: torch.Tensor, leaves: list[torch.Tensor], v: torch.Tensor, ndim: int
          ) -> torch.Tensor | None:
    """|dy/dleaves|^T v, one value per element of the input (an id's embedding: its largest)."""
    grads = torch.autograd.grad(y, leaves, v, retain_graph=True, allow_unused=True)
    used = [g.detach().abs() for g in grads if g is not None]
    used = [g.flatten(ndim).amax(-1) if g.ndim > ndim else g for g in used]
    if not used or any(g.shape != used[0].shape for g in used):
        return None
    return torch.stack(used).amax(0)


def _depends(g: torch.Tensor, axis: int) -> list[int]:
    """The indices along ``axis`` with a gradient above ``TOL`` of the largest."""
    moved = g.movedim(axis, 0)
    largest = moved.reshape(moved.shape[0], -1).amax(1)
    scale = float(largest.max()) if largest.numel() else 0.0
    return [int(i) for i in torch.nonzero(largest > TOL * scale).flatten()] if scale > 0 else []


def _vjp_at(y: torch.Tensor, leaves: list[torch.Tensor], ndim: int, axis: int, index: int,
            gen: torch.Generator) -> torch.Tensor | None:
    """The gradient of ``y``'s slice ``index`` along ``axis`` (random weights) by the input."""
    v = torch.zeros_like(y)
    part = torch.randn(v.select(axis, index).shape, generator=gen, dtype=torch.float64)
    v.select(axis, index).copy_(part.to(device=y.device, dtype=y.dtype))
    return _grad(y, leaves, v, ndim)


def _batch(y: torch.Tensor, leaves: list[torch.Tensor], shape: torch.Size,
           gen: torch.Generator, twin: nn.Module) -> Fact:
    """Which samples the output's first and last samples depend on, along the pair of axes
    (the output's first or second, an input axis of its size) where they depend on the
    fewest; a tie goes to the output's first axis and the input's first."""
    best: tuple[float, int, int, dict[int, list[int]]] | None = None
    for a in range(min(2, y.ndim)):
        n = y.shape[a]
        candidates = [d for d in range(len(shape)) if shape[d] == n]
        if n < 2 or not candidates:
            continue
        grads = {i: _vjp_at(y, leaves, len(shape), a, i, gen) for i in (0, n - 1)}
        for d in candidates:
            deps = {i: [j for j in _depends(g, d) if j != i] for i, g in grads.items()
                    if g is not None}
            if not deps:
                continue
            share = sum(len(v) for v in deps.values()) / (len(deps) * (n - 1))
            if best is None or share < best[0]:
                best = (share, d, n, deps)
        if best is not None and best[0] == 0:
            break  # kept apart along the output's first axis: its second is not asked
    if best is None:
        return {"what": "undecided", "why": "no axis of its output has the size of an axis "
                "of its input, so no batch axis is known"}
    share, axis, n, deps = best
    if share == 0:
        return {"what": "batch", "verdict": "apart", "axis": axis, "samples": n}
    sample, sees = max(deps.items(), key=lambda kv: len(kv[1]))
    mixers = [name for name, m in twin.named_modules() if isinstance(m, _BatchNorm)
              and m.training]
    return {"what": "batch", "verdict": "all" if len(sees) == n - 1 else "some", "axis": axis,
            "samples": n, "sample": sample, "sees": sees[:8], "count": len(sees),
            "mixers": mixers, "module": mixers[0] if mixers else ""}


def _shifted_axis(x: torch.Tensor) -> int | None:
    """The axis ``x`` is ``base[..., :-1]`` along (the input of next-step prediction, whose
    targets are ``base[..., 1:]``), or None."""
    base = x._base
    if base is None or base.ndim != x.ndim or x.storage_offset() != base.storage_offset():
        return None
    shorter = [d for d in range(x.ndim) if base.shape[d] != x.shape[d]]
    if len(shorter) == 1 and base.shape[shorter[0]] == x.shape[shorter[0]] + 1:
        return shorter[0]
    return None


_PAD_ARGS = ("key_padding_mask", "src_key_padding_mask", "tgt_key_padding_mask")


def _pattern(mask: Any) -> str | None:
    """``torch.triu(ones, k)`` / ``torch.tril(ones, k)`` where a (T, T) mask's hidden
    positions are that (|k| <= 2), else None."""
    if not isinstance(mask, torch.Tensor) or mask.ndim not in (2, 3):
        return None
    m = mask[0] if mask.ndim == 3 else mask
    if m.shape[0] != m.shape[1] or m.shape[0] < 2:
        return None
    hidden = m if m.dtype == torch.bool else (m < -1e4)
    ones = torch.ones_like(hidden, dtype=torch.bool)
    for k in range(-2, 3):
        for fn in (torch.triu, torch.tril):
            if torch.equal(hidden, fn(ones, k)):
                return f"torch.{fn.__name__}(ones, {k})"
    return None


def _causal(seen: _Seen, next_step: bool, gen: torch.Generator) -> list[Fact]:
    """For each outermost attention module with a mask that orders positions (or any, in a
    model fed ``x[:, :-1]``): whether positions 0 and T/2 see later positions."""
    facts: list[Fact] = []
    for name, e in seen.attention.items():
        out, delta, masks = e.get("out"), e["delta"], e["masks"]
        ordering = {k: _pattern(v) for k, v in masks.items()
                    if k not in _PAD_ARGS and "memory" not in k and _pattern(v)}
        causal_flag = any(v is True for k, v in masks.items() if k.endswith("is_causal"))
        if out is None or out.shape != delta.shape or not (ordering or causal_flag
                                                           or next_step):
            continue
        axis = 1 if e["batch_first"] and out.ndim == 3 else 0
        positions = out.shape[axis]
        leaks: dict[int, list[int]] = {}
        for t in sorted({0, positions // 2}):
            g = _vjp_at(out, [delta], delta.ndim, axis, t, gen) if t < positions - 1 else None
            later = [j for j in _depends(g, axis) if j > t] if g is not None else []
            if later:
                leaks[t] = later
        fact: Fact = {"what": "causal", "module": name, "positions": positions,
                      "masks": ordering, "is_causal": causal_flag, "next_step": next_step,
                      "verdict": "leaks" if leaks else "holds"}
        if leaks:
            t, later = next(iter(leaks.items()))
            fact.update(position=t, sees=later[:8], count=len(later))
        facts.append(fact)
    return facts


def _aligned(pad: torch.Tensor) -> bool:
    """Each row's padded positions are a run at its end (or all at its start)."""
    flags = pad.to(torch.int8)
    right = torch.equal(flags, flags.cummax(1).values)
    left = torch.equal(flags.flip(1), flags.flip(1).cummax(1).values)
    return right or left


def _padded(x: torch.Tensor, seen: _Seen) -> tuple[torch.Tensor, str] | None:
    """Which (batch, position) of the input are padded, and who says so: the ids equal to
    the padding_idx of the Embedding that reads them, right- or left-aligned; else the first
    key_padding_mask of the input's shape."""
    if not x.is_floating_point() and x.ndim == 2 and seen.pad_idx is not None:
        pad = x == seen.pad_idx
        if pad.any() and not pad.all() and _aligned(pad):
            return pad, f"padding_idx {seen.pad_idx}"
    for _, k, pad in _pad_masks(seen, x.shape[:2]):
        if pad.any() and not pad.all():
            return pad, k
    return None


def _pad_masks(seen: _Seen, shape: tuple[int, ...]) -> Iterator[tuple[str, str, torch.Tensor]]:
    """(module, argument, padded positions on the CPU) of each key_padding_mask of ``shape``."""
    for name, e in seen.attention.items():
        for k in _PAD_ARGS:
            m = e["masks"].get(k)
            if isinstance(m, torch.Tensor) and tuple(m.shape) == tuple(shape):
                yield name, k, (m if m.dtype == torch.bool else m != 0).cpu()


def _padding(y: torch.Tensor, leaves: list[torch.Tensor], pad: torch.Tensor, source: str,
             seen: _Seen, gen: torch.Generator) -> Fact:
    """Whether the output at real positions (all of it, without a position axis) depends on
    padded positions; and how each attention module's key_padding_mask reads the padding."""
    v = torch.randn(y.shape, generator=gen, dtype=torch.float64).to(y.device, y.dtype)
    if tuple(y.shape[:2]) == tuple(pad.shape):
        v[pad.to(y.device)] = 0
    g = _grad(y, leaves, v, 2)
    if g is None:
        return {}
    g = g.cpu()
    scale = float(g.max())
    on_pad = int((g[pad] > TOL * scale).sum()) if scale > 0 else 0
    fact: Fact = {"what": "padding", "verdict": "leaks" if on_pad else "holds",
                  "source": source, "padded": int(pad.sum()), "positions": pad.numel(),
                  "seen": on_pad, "masks": [], "module": ""}
    for name, k, hidden in _pad_masks(seen, pad.shape):
        reads = ("same" if torch.equal(hidden, pad) else
                 "inverted" if torch.equal(hidden, ~pad) else "other")
        fact["masks"].append({"module": name, "arg": k, "reads": reads,
                              "hidden": int(hidden.sum())})
        if reads != "same" and not fact["module"]:
            fact["module"] = name
    return fact
