"""Which traced calls made each input of a call, in recorded steps: the data flow between calls.

An input with autograd history is followed back from its ``grad_fn`` through
``next_functions``, across functional ops (``F.relu``, ``torch.cat``, ``x * 0.5``, a residual
``+``), to the nearest nodes that a traced call's output made: ``GradHooks`` marks them in
``node.metadata`` for the gradient hooks, and the call that returned the node last is its
producer (a parent returning its child's output unchanged: the parent). The walk is breadth
first and bounded: at most ``MAX_NODES`` nodes per tensor, each once, so that an input made by
a long computation outside any traced call (what the bound cuts short is then "made by no
call") costs a bounded time; measured in docs/performance.md. An input without autograd
history (``no_grad``, ``eval``, ``.detach()``, integer tensors) is looked up among the outputs
of the step's calls that have none, and of its model calls, held weakly: the same tensor, else
one at its storage's address: a view from its first element (``flatten``), or a ``.detach()`` of
a model's output (a GAN's fake batch). Where autograd records nothing (under ``no_grad``; a
``cat`` of tensors none of which needs a gradient), the operations are followed instead inside
model calls (``follower.py`` says when): each one's outputs are made by the calls that made its
inputs (a new view of an input is found as itself, not at the input's address). Not followed: a
``.detach()`` of a call's output inside a model, operations outside model calls.

A call that returns its input unchanged (``nn.Identity``, ``Dropout(p=0)``, ``nn.Flatten`` of a
2-d batch) passes it on: it stands for the tensor's maker only while the call around it runs
(its siblings read what it returned), and once that call returned the maker is again the one
before it: a later call that reads the same tensor elsewhere (an actor's and a critic's feature
extractors, both flattening the observations) did not read it from the first. One that returns
a view of its input (a ``Flatten`` that reshapes) made that view, not its input: it is found
for the view itself, not by the address they share.

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
from operator import attrgetter
from typing import Any

import torch

from hooktrace.hooks.follower import Follower, tensors
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
_Stored = tuple[weakref.ref[torch.Tensor], _Found]  # an output held weakly, who made it


#: What a call knows of its data flow when it begins: who made each positional input (and
#: which of their outputs), the last seq of a forward call seen so far (the calls after it
#: ran inside this one), the inputs and their versions (() where a tensor has none: an
#: inference tensor), to tell an input returned unchanged, and what it did to the follower of
#: operations (0, FOLLOWS, PAUSED). A plain tuple: one is made per call
Sources = tuple[tuple[_Found, ...], int, list[torch.Tensor], tuple[int, ...], int]
_version = attrgetter("_version")


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


def _made_by(dispatch: Sequence[Any], nr: int, passing: set[int]) -> tuple[int, int] | None:
    """The seq of the call that returned output ``nr`` of a node last, and the index of that
    output among the call's, as its dispatch has it (quadruples output_nr, call, index, shape;
    index >= 0 an output, < 0 an input); None: none did. A call that took it as an input too
    passed it on: its maker only while it is ``passing`` (the call around it runs)."""
    passed = [dispatch[k + 1] for k in range(0, len(dispatch), 4)
              if dispatch[k + 2] < 0 and dispatch[k] == nr]
    for k in range(len(dispatch) - 4, -1, -4):
        if (index := dispatch[k + 2]) >= 0 and dispatch[k] == nr:
            call = dispatch[k + 1]
            seq: int = call.seq
            if passed and seq not in passing and any(call is c for c in passed):
                continue
            return seq, index
    return None


class DataFlow:
    """The producers of a call's inputs, asked at its start (positional) and end (keywords)."""

    def __init__(self, grads: GradHooks) -> None:
        self._grads = grads
        self._last = -1  # the seq of the last recorded forward call that returned
        # storage address, and the output's id -> (the output, held weakly, the calls that made
        # it and which of their outputs)
        self._stored: dict[int, _Stored] = {}
        self._objects: dict[int, _Stored] = {}
        # calls that passed an input on, while the call around them runs: (seq, the id of the
        # tensor and what it was found as before, for one without autograd history)
        self._passes: list[tuple[int, int, _Stored | None]] = []
        self._passing: set[int] = set()
        self._cut = False  # a walk met an edge without autograd history, or stopped at its bound
        self._ops = Follower(self.follow)  # where autograd records nothing

    def start(self, inputs: list[torch.Tensor]) -> Sources:
        mark = self._ops.begin()
        try:
            versions = tuple(map(_version, inputs))
        except RuntimeError:  # an inference tensor has no version
            versions = ()
        found = tuple(map(self._of, inputs))
        return found, self._last, inputs, versions, mark

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
        found, before, inputs, versions, mark = sources
        while self._passes and self._passes[-1][0] > before:  # the calls inside it
            self._passed()
        self._ops.after(before, mark, outputs, top)
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
            if any(t is s for s in inputs) and self._passes_on(t, seq, i, inputs, versions):
                continue
            # one with autograd history is found by its node, unless detached: a model's output
            # (a GAN's fake batch) is kept for that; not every call's, each an object that
            # lives until the step ends, and costs the garbage collector
            if t.grad_fn is not None and not top:
                continue
            address = _address(t)
            if address:
                self._keep(t, address, seq, i, inputs, versions)
        self._last = seq
        return tuple([f[0] for f in found]), made, tuple([f[1] for f in found]), made_out, cut

    def _passes_on(self, t: torch.Tensor, seq: int, i: int, inputs: list[torch.Tensor],
                   versions: tuple[int, ...]) -> bool:
        """Output ``i`` of call ``seq`` is one of its inputs: whether it left it unchanged (an
        in-place change, ``ReLU(inplace=True)``, made it); if so it passes it on, its maker
        until the call around it returns."""
        k = next(k for k, s in enumerate(inputs) if s is t)
        if k >= len(versions) or t._version != versions[k]:
            return False
        self._passing.add(seq)
        before = None
        if t.grad_fn is None:  # found by its id meanwhile
            before = self._objects.get(id(t))
            self._objects[id(t)] = (weakref.ref(t), ((seq,), (i,)))
        self._passes.append((seq, id(t), before))
        return True

    def _passed(self) -> None:
        """The call around the last call that passed a tensor on returned: the tensor's maker
        is again the one before."""
        seq, ident, before = self._passes.pop()
        self._passing.discard(seq)
        if before is not None:
            self._objects[ident] = before
        elif (kept := self._objects.get(ident)) is not None and kept[1][0] == (seq,):
            del self._objects[ident]

    def _keep(self, t: torch.Tensor, address: int, seq: int, i: int,
              inputs: list[torch.Tensor], versions: tuple[int, ...]) -> None:
        """Keep output ``i`` of call ``seq`` to be looked up; for itself only where it shares
        its address with an input it left unchanged (a view of it)."""
        own = True  # found at its address too
        for k, s in enumerate(inputs):
            if own and _address(s) == address:
                own = not (k < len(versions) and s._version == versions[k])
        self._put(t, ((seq,), (i,)), address if own else 0)

    def _put(self, t: torch.Tensor, found: _Found, address: int) -> None:
        """``t`` made by ``found``: looked up as itself, and at ``address`` (0: not)."""
        if len(self._objects) > _MAX_STORED:
            self._stored.clear()
            self._objects.clear()
        kept = (weakref.ref(t), found)
        self._objects[id(t)] = kept
        if address:
            self._stored[address] = kept

    def follow(self, ins: list[torch.Tensor], out: Any) -> None:
        """An operation autograd records nothing of made ``out`` from ``ins``: its outputs are
        made by the calls that made its inputs."""
        found = _merged([self._of(t) for t in ins])
        if found[0]:
            for t in tensors((out,), None):
                # a new view of an input: found as itself, never at its input's address (where
                # a tensor passed on would stay the maker for every later reader)
                address = _address(t)
                if all(t is not s for s in ins) and any(_address(s) == address for s in ins):
                    address = 0
                self._put(t, found, address)

    def raised(self) -> None:
        """A model call raised: its follower of operations off the program's stack."""
        self._ops.stop()

    def clear(self) -> None:
        """The step ended: its outputs are no longer looked up."""
        self._stored.clear()
        self._objects.clear()
        self._passes.clear()
        self._passing.clear()
        self._ops.stop()

    def _of(self, t: torch.Tensor) -> _Found:
        """The recorded calls whose outputs made ``t``, and which output of each."""
        node: Any = t.grad_fn  # its ``metadata`` is a dict at runtime, a method in the stubs
        if node is None:
            stored = self._objects.get(id(t))
            if stored is None or stored[0]() is not t:
                stored = self._stored.get(_address(t))
                if stored is None or stored[0]() is None:
                    return _NONE
            return stored[1]
        nr = t.output_nr
        dispatch = node.metadata.get(self._grads)
        # the usual case: a call's output itself
        if dispatch and (made := _made_by(dispatch, nr, self._passing)) is not None:
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
            made = _made_by(dispatch, nr, self._passing) if dispatch is not None else None
            if made is not None:
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


def _merged(founds: list[_Found]) -> _Found:
    """The calls that made any of several tensors, each with its output used (-1: several)."""
    if len(founds) == 1:
        return founds[0]
    outs: dict[int, int] = {}
    for seqs, used in founds:
        for seq, index in zip(seqs, used, strict=True):
            outs[seq] = index if outs.get(seq, index) == index else -1
    seqs = tuple(sorted(outs))
    return seqs, tuple(outs[s] for s in seqs)
