"""`hooktrace run` under the real torchrun (gloo on CPU): one log per rank, DDP's prefix gone."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, events, hooktrace_cmd, read_log

from hooktrace import schema

SCRIPT = ROOT / "tests" / "scripts" / "ddp_train.py"


def _torchrun(tmp_path: Path, nproc: int, port: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
         "--master_port", str(port), "-m", "hooktrace", "run", "-o", "ddp.jsonl", str(SCRIPT)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300)


def _order(path: Path) -> list[tuple[int, str, str, int]]:
    return [(e.step, e.phase, e.name, e.call) for e in events(path)]


@pytest.mark.slow
def test_two_ranks_write_one_log_each_named_as_single_process(tmp_path: Path) -> None:
    result = _torchrun(tmp_path, 2, 29541)
    assert result.returncode == 0, result.stderr
    single = tmp_path / "single.jsonl"
    assert hooktrace_cmd("run", "-o", single, SCRIPT).returncode == 0
    for rank in (0, 1):
        log = tmp_path / f"ddp.rank{rank}.jsonl"
        header = read_log(log)[0]
        assert isinstance(header, schema.Header)
        assert (header.rank, header.local_rank, header.world_size) == (rank, rank, 2)
        modules = [r.name for r in read_log(log) if isinstance(r, schema.Module)]
        assert modules == ["", "fc1", "extra", "fc2"]  # no "module." prefix, no DDP wrapper
        assert _order(log) == _order(single)  # DDP changes neither names nor order
        end = read_log(log)[-1]
        assert isinstance(end, schema.End) and (end.status, end.steps) == ("ok", 3)
    assert not (tmp_path / "ddp.jsonl").exists()


@pytest.mark.slow
def test_four_ranks_complete(tmp_path: Path) -> None:
    result = _torchrun(tmp_path, 4, 29542)
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in tmp_path.glob("ddp.rank*.jsonl")) == [
        f"ddp.rank{r}.jsonl" for r in range(4)]
