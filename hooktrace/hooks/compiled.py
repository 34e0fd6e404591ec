"""Whether a module is part of ``torch.compile``'d code rather than of the program: a graph
its runtime calls (``aot_eager``'s ``GraphModule``), which global module hooks see as a new
top-level module in every step that runs compiled."""

from __future__ import annotations

import sys
from pathlib import Path
from types import FrameType

import torch
from torch import nn

# where torch.compile's runtime calls the graphs it compiled
_COMPILE_DIRS = tuple(str(Path(torch.__file__).parent / d) for d in ("_dynamo", "_functorch"))
_COMPILE_FRAMES = 64


def compiled_graph(module: nn.Module) -> bool:
    """Whether ``module`` is a graph ``torch.compile`` made and its runtime calls (aot_eager's
    ``GraphModule``): part of the compiled code, not a model of the program's."""
    if not isinstance(module, torch.fx.GraphModule) or "torch._dynamo" not in sys.modules:
        return False
    frame: FrameType | None = sys._getframe(1)
    for _ in range(_COMPILE_FRAMES):
        if frame is None:
            return False
        if frame.f_code.co_filename.startswith(_COMPILE_DIRS):
            return True
        frame = frame.f_back
    return False
