"""The follower of operations: data flow where autograd records nothing, and when it is on.

A ``TorchDispatchMode``, below autograd so that no ``has_torch_function`` check (the fast path
of ``nn.MultiheadAttention``) sees it, hands each operation autograd records nothing of (under
``no_grad``, or on inputs none of which needs a gradient) to ``DataFlow.follow``, which keeps
its outputs as made by the calls that made its inputs. In recorded steps, inside model calls:

- while a call that began under ``no_grad`` runs (llm.c's validation, its residual adds; an RL
  target's ``cat`` of next observations and actions);
- in the code around a call that returned data without autograd history (one under ``no_grad``;
  an ``nn.Flatten`` that returns a 2-d batch as it is), until the call around it returns:
  SB3's critics ``cat`` their features and the actions, with gradients on (SAC's and TD3's
  default critic) or off (a features extractor shared with the actor). Not while a call with
  gradients on runs inside that code: its operations are autograd's (following every operation
  of a recorded step cost W1 1.4x its CPU time).

Never left on over a mode of the program in the code around a call, and never outside model
calls (the training loop's: the follower would sit above the program's modes). Not followed:
operations with gradients on whose inputs need one (autograd's), hooktrace's own.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from hooktrace.hooks.sites import OURS, TORCH

_grad_enabled = torch.is_grad_enabled
#: what a call did to the follower at its start: put it on (it began under no_grad), or took it
#: off (it began with gradients on while the follower was on for the code around it)
FOLLOWS, PAUSED = 1, 2
_AWAY = -2  # no call left the follower on (below every seq and every ``before``, -1 and up)


class Follower(TorchDispatchMode):  # type: ignore[no-untyped-call]  # torch's is untyped
    """Hands the operations it sees to ``follow`` (inputs, output). On this thread's stack
    (``put_on``, ``take_off``) as a recorded call's start (``begin``) and end (``after``) say;
    an error stops it for the run, and is raised at the next call's start (tracing stops)."""

    def __init__(self, follow: Callable[[list[torch.Tensor], Any], None]) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.follow = follow
        self.live = True
        self.error: Exception | None = None
        # on for the code around calls that returned data without autograd history, until the
        # call around the first of them returns: the first call to end whose ``before`` (the
        # seq of the last call returned when it began) is at most this one's
        self._until = _AWAY

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False  # no wrapper that keeps dynamo out (two frames an operation): it runs eagerly

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        out = func(*args, **kwargs) if kwargs else func(*args)
        if self.live:
            try:
                ins = tensors(args, kwargs)  # none: made from nothing (arange)
                if ins and not (_grad_enabled() and any(t.requires_grad for t in ins)) \
                        and not _ours(sys._getframe(1)):  # else autograd's, or hooktrace's
                    self.follow(ins, out)
            except Exception as e:  # never break the user's operation
                self.live = False
                self.error = e
        return out

    def begin(self) -> int:
        """At a recorded call's start: what it did to the follower (0, FOLLOWS, PAUSED)."""
        if self.error is not None:
            error, self.error = self.error, None
            raise error
        if not _grad_enabled():
            if self.live and not self.on_stack():
                self.put_on()
                return FOLLOWS
        elif self._until != _AWAY and self.on_stack():
            self.take_off()
            return PAUSED
        return 0

    def after(self, before: int, mark: int, outputs: list[torch.Tensor], top: bool) -> None:
        """At the end of a recorded call that began after call ``before`` returned, and did
        ``mark`` at its start; off after a model call (``top``; also one whose calls raised)."""
        ended = before <= self._until  # it is the call around those that left the follower on
        if top or ended:
            self._until = _AWAY
        if top:
            self.take_off()
            return
        if mark == FOLLOWS or ended:  # off before it
            on = _without_history(outputs)
        elif mark == PAUSED:
            on = self._until != _AWAY
        elif _without_history(outputs) and (self._until != _AWAY or not self.on_stack()):
            on = True  # (on and no call left it on: a call around it began under no_grad)
        else:
            return
        stacked = self.on_stack()
        if on and self.live and torch._C._len_torch_dispatch_stack() == stacked:
            if self._until == _AWAY:
                self._until = before
            if not stacked:
                self.put_on()
        else:  # never over a mode of the program
            self.take_off()

    def stop(self) -> None:
        """The step ended."""
        self._until = _AWAY
        self.take_off()

    def on_stack(self) -> bool:
        stack = torch._C._get_dispatch_stack_at
        return any(stack(i) is self for i in range(torch._C._len_torch_dispatch_stack()))

    def put_on(self) -> None:
        torch._C._push_on_torch_dispatch_stack(self)

    def take_off(self) -> None:
        """Off this thread's stack, also from under modes pushed after it."""
        if not self.on_stack():
            return
        above = []
        while (mode := torch._C._pop_torch_dispatch_stack(None)) is not self:
            above.append(mode)
        for mode in reversed(above):
            torch._C._push_on_torch_dispatch_stack(mode)


def _without_history(outputs: list[torch.Tensor]) -> bool:
    # a loop, not any(): asked at every recorded call's end, half the time (0.15 us, not 0.33)
    for t in outputs:  # noqa: SIM110
        if t.grad_fn is None and not t.requires_grad:
            return True
    return False


def tensors(args: Sequence[Any], kwargs: dict[str, Any] | None) -> list[torch.Tensor]:
    """The tensors among an operation's arguments (or outputs), and in lists of them."""
    found = []
    for a in (*args, *kwargs.values()) if kwargs else args:
        if isinstance(a, torch.Tensor):
            found.append(a)
        elif isinstance(a, (list, tuple)):
            found += [t for t in a if isinstance(t, torch.Tensor)]
    return found


def _ours(frame: FrameType | None) -> bool:
    """Whether the code that ran an operation is hooktrace's: the first frame that is neither
    torch's nor a function mode's handler passing the operation on (the op zoom's, the loss
    window's)."""
    while frame is not None and (frame.f_code.co_filename.startswith(TORCH)
                                 or frame.f_code.co_name == "__torch_function__"):
        frame = frame.f_back
    return frame is not None and frame.f_code.co_filename.startswith(OURS)
