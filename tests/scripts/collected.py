"""One case of a bug script of this folder, run as a function that returns before the garbage
collector runs, inside the trace: the case's models and optimizers (cycles included) are gone
before tracing stops, as in a script whose training lives in a ``main()`` that returned.

    python collected.py SCRIPT.CASE        (blind_bugs5.clip_negative)
"""

from __future__ import annotations

import gc
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path

import torch


def case_of(script: str, case: str) -> Callable[[], object]:
    """``CASES[case]`` of the script ``SCRIPT.py`` beside this one, imported as a module."""
    path = Path(__file__).with_name(f"{script}.py")
    spec = importlib.util.spec_from_file_location(script, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[script] = module  # its dataclasses and pickles look their module up
    spec.loader.exec_module(module)
    return module.CASES[case]  # type: ignore[no-any-return]


if __name__ == "__main__":
    script, case = sys.argv[1].split(".")
    run = case_of(script, case)
    sys.argv = [f"{script}.py", case]
    torch.manual_seed(0)
    run()
    del run
    gc.collect()
    print(f"{case}: done, collected")
