"""Which traced calls made each input of a call, in recorded steps: the data flow between calls.

An input with autograd history is followed back from its ``grad_fn`` through
``next_functions``, across functional ops (``F.relu``, ``torch.cat``, ``x * 0.5``, a residual
``+``), to the nearest nodes that a traced call's output made: ``GradHooks`` marks them in
``node.metadata`` for the gradient hooks, and the call that returned the node last is its
producer (a parent returning its child's output unchanged: the parent). The walk is breadth
first and bounded: at most ``MAX_NODES`` nodes per tensor, each once, so that an input made by
a long computation outside any traced call (what the bound cuts short is then "made by no
call") costs a bounded time; measured in docs/performance.md. An input without autograd
history (``no_grad``, ``eval``, ``.detach()``, integer tensors) is looked up by its storage's
address among the outputs of the step's calls that have none, and of its model calls, held
weakly: the same tensor, a view from its first element (``flatten``), or a ``.detach()`` of
a model's output (a GAN's fake batch). A functional op that makes a new tensor without
autograd history (``F.relu`` under ``no_grad``), or a ``.detach()`` of a call's output inside
a model, hides its producer.

A call that others ran inside (a block) also says which calls made its outputs (``made``): those
inside it, and those before it whose data it passed on (a residual's skip); a picture that
draws it as a box of its calls draws those instead. Where something without autograd history
went into its outputs on the way back to those calls (a ``.detach()``ed result, one made under
``no_grad``, a buffer or the model's input added in: an edge autograd leaves empty), or the walk
stopped at its bound, ``made`` may miss a call, and the call says so (``made_no_history``): a
call inside whose output gets no gradient may have gone into its outputs all the same. Watched
steps never come here: the core asks only in recorded ones.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import torch

from hooktrace.hooks.gradhooks import GradHooks

#: autograd nodes looked at per tensor. Measured (docs/performance.md): every input of
#: resnet18's and a TransformerEncoder's calls is found within 3, of a ViT's within 8
MAX_NODES = 64
_MAX_STORED = 8192  # outputs looked up by storage at once; forward-only code never ends a pass
_PLAIN = torch.Tensor.__torch_dispatch__
Producers = tuple[int, ...]  # the seqs of the calls that made a tensor, ascending
Outs = tuple[int, ...]  # parallel to Producers: which output of each (-1: several)
_Found = tuple[Producers, Outs]
#: (``inputs_from``, ``made``, ``from_out``, ``made_out``, ``made_no_history``) of a call
_Flow = tuple[tuple[Producers, ...], Producers, tuple[Outs, ...], tuple[Producers, ...], bool]
_NONE: _Found = ((), ())


#: What a call knows of its data flow when it begins: who made each positional input (and
#: which of their outputs), and the last seq of a forward call seen so far (the calls after it
#: ran inside this one). A plain tuple: one is made per call
Sources = tuple[tuple[_Found, ...], int]


def _address(t: torch.Tensor) -> int:
    """Where ``t``'s numbers start: 0 for a tensor without numbers of its own to look up (an
    empty, meta or nested one; a subclass with its own dispatch: a fake tensor, whose
    ``data_ptr`` warns, or a distributed one)."""
    kind = type(t)
    if kind is not torch.Tensor and kind.__torch_dispatch__ is not _PLAIN:
        return 0
    try:
        address: int = t.data_ptr()
    except RuntimeError:  # no storage
        return 0
    return address


def _made_by(dispatch: Sequence[Any], nr: int) -> tuple[int, int] | None:
    """The seq of the call that returned output ``nr`` of a node last, and the index of that
    output among the call's, as its dispatch has it (quadruples output_nr, call, index, shape;
    index >= 0 an output); None: none did."""
    for k in range(len(dispatch) - 4, -1, -4):
        if (index := dispatch[k + 2]) >= 0 and dispatch[k] == nr:
            seq: int = dispatch[k + 1].seq
            return seq, index
    return None


class DataFlow:
    """The producers of a call's inputs, asked at its start (positional) and end (keywords)."""

    def __init__(self, grads: GradHooks) -> None:
        self._grads = grads
        self._last = -1  # the seq of the last recorded forward call that returned
        # storage address -> (the output, held weakly, the seq of the call that returned it,
        # and its index among that call's outputs)
        self._stored: dict[int, tuple[weakref.ref[torch.Tensor], int, int]] = {}
        self._cut = False  # a walk met an edge without autograd history, or stopped at its bound

    def start(self, inputs: list[torch.Tensor]) -> Sources:
        return tuple(map(self._of, inputs)), self._last

    def end(self, sources: Sources | None, kw_inputs: list[torch.Tensor],
            outputs: list[torch.Tensor], seq: int, top: bool) -> _Flow | tuple[()]:
        """(the producers of each input, args then kwargs; the calls inside it that made its
        outputs; which output of each producer each input used; the calls that made each of
        its outputs, when it has several; whether something without autograd history went
        into its outputs, which carry some: ``made`` may miss a call), and those of its
        outputs that a later call can find only by their storage kept (``top``: a model call);
        () for a call that began in a step not recorded."""
        if sources is None:
            return ()
        found, before = sources
        if kw_inputs:
            found += tuple(map(self._of, kw_inputs))
        made: Producers = ()
        made_out: tuple[Producers, ...] = ()
        cut = False
        if self._last > before:  # calls returned while it ran: calls inside it
            self._cut = False
            per_output = tuple(self._of(t)[0] for t in outputs)
            made = tuple(sorted({s for calls in per_output for s in calls}))
            if len(per_output) > 1 and len(set(per_output)) > 1:
                made_out = per_output
            cut = _untracked(outputs, self._cut)
        for i, t in enumerate(outputs):
            # one with autograd history is found by its node, unless detached: a model's output
            # (a GAN's fake batch) is kept for that; not every call's, each an object that
            # lives until the step ends, and costs the garbage collector
            if t.grad_fn is not None and not top:
                continue
            address = _address(t)
            if address:
                if len(self._stored) > _MAX_STORED:
                    self._stored.clear()
                self._stored[address] = (weakref.ref(t), seq, i)
        self._last = seq
        return tuple([f[0] for f in found]), made, tuple([f[1] for f in found]), made_out, cut

    def clear(self) -> None:
        """The step ended: its outputs are no longer looked up by storage."""
        self._stored.clear()

    def _of(self, t: torch.Tensor) -> _Found:
        """The recorded calls whose outputs made ``t``, and which output of each."""
        node: Any = t.grad_fn  # its ``metadata`` is a dict at runtime, a method in the stubs
        if node is None:
            stored = self._stored.get(_address(t))
            return _NONE if stored is None or stored[0]() is None else (
                (stored[1],), (stored[2],))
        nr = t.output_nr
        dispatch = node.metadata.get(self._grads)
        if dispatch:  # the usual case: a call's output itself
            if (index := dispatch[-2]) >= 0 and dispatch[-4] == nr:  # returned it last
                seq: int = dispatch[-3].seq
                return ((seq,), (index,)) if seq >= 0 else _NONE
            if (made := _made_by(dispatch, nr)) is not None:
                return ((made[0],), (made[1],)) if made[0] >= 0 else _NONE
        return self._walk(node, nr)

    def _walk(self, node: Any, nr: int) -> _Found:
        """Breadth first from output ``nr`` of ``node`` (made by no call) to the nearest nodes
        a call's output made, at most MAX_NODES nodes; a call not recorded (seq -1) is not
        looked past."""
        grads = self._grads
        found: dict[int, int] = {}  # seq -> its output used (-1: several)
        seen = {node}
        todo: list[Any] = list(node.next_functions)
        visited = 1
        for node, nr in todo:  # grows as it goes
            if node is None:  # an input without autograd history: who made it is not seen
                self._cut = True
                continue
            if node in seen:
                continue
            if visited == MAX_NODES:
                self._cut = True
                break
            visited += 1
            seen.add(node)
            dispatch = node.metadata.get(grads)
            if dispatch is not None and (made := _made_by(dispatch, nr)) is not None:
                seq, index = made
                if seq >= 0:
                    found[seq] = index if found.get(seq, index) == index else -1
                continue
            todo.extend(node.next_functions)
        seqs = tuple(sorted(found))
        return seqs, tuple(found[s] for s in seqs)


def _untracked(outputs: list[torch.Tensor], cut: bool) -> bool:
    """Something without autograd history went into outputs that carry some: an edge without
    it met on the way back (``cut``), or a floating output without it beside them (integers
    carry no gradient, whatever made them)."""
    if not any(t.requires_grad for t in outputs):
        return False  # no gradient can come back into it (no_grad, a model's data)
    return cut or any(not t.requires_grad and t.is_floating_point() for t in outputs)
