"""`hooktrace run` under the real torchrun (gloo on CPU): one log per rank, DDP's prefix gone."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import ROOT, events, hooktrace_cmd, read_log

from hooktrace.check.checklog import run_checks, run_checks_ranks
from hooktrace.log import schema
from hooktrace.log.reader import LogReader
from hooktrace.log.writer import LogWriter

SCRIPT = ROOT / "tests" / "scripts" / "ddp_train.py"


# torch's gloo teardown sometimes aborts a rank at exit on this 2-core machine, after the script
# and hooktrace are done, with this message; plain torchrun of the same script without
# hooktrace does it too (2 runs in 8 with 4 ranks). Such a run is tried again, at most twice.
TEARDOWN_ABORT = "terminate called without an active exception"


def _torchrun(tmp_path: Path, nproc: int, *script_args: str, script: Path = SCRIPT,
              log: str = "ddp.jsonl") -> subprocess.CompletedProcess[str]:
    # --standalone: a rendezvous on a free local port, so runs never collide on a fixed one
    for _ in range(3):
        result = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
             str(nproc), "-m", "hooktrace", "run", "-o", log, str(script), *script_args],
            cwd=tmp_path, capture_output=True, text=True, timeout=300)
        if result.returncode == 0 or TEARDOWN_ABORT not in result.stderr:
            break
    return result


def _order(path: Path) -> list[tuple[int, str, str, int]]:
    return [(e.step, e.phase, e.fqn, e.call) for e in events(path)]


@pytest.mark.slow
def test_two_ranks_write_one_log_each_named_as_single_process(tmp_path: Path) -> None:
    result = _torchrun(tmp_path, 2)
    assert result.returncode == 0, result.stderr
    single = tmp_path / "single.jsonl"
    assert hooktrace_cmd("run", "-o", single, SCRIPT).returncode == 0
    for rank in (0, 1):
        log = tmp_path / f"ddp.rank{rank}.jsonl"
        header = read_log(log)[0]
        assert isinstance(header, schema.Header)
        assert (header.rank, header.local_rank, header.world_size) == (rank, rank, 2)
        modules = [r.fqn for r in read_log(log) if isinstance(r, schema.Module)]
        assert modules == ["", "fc1", "extra", "fc2"]  # no "module." prefix, no DDP wrapper
        assert _order(log) == _order(single)  # DDP changes neither names nor order
        end = read_log(log)[-1]
        assert isinstance(end, schema.End) and (end.status, end.steps) == ("ok", 3)
    assert not (tmp_path / "ddp.jsonl").exists()


@pytest.mark.slow
def test_four_ranks_complete(tmp_path: Path) -> None:
    result = _torchrun(tmp_path, 4)
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in tmp_path.glob("ddp.rank*.jsonl")) == [
        f"ddp.rank{r}.jsonl" for r in range(4)]


@pytest.mark.slow
def test_healthy_ranks_agree(tmp_path: Path) -> None:
    run = _torchrun(tmp_path, 2)
    assert run.returncode == 0, run.stderr
    result = hooktrace_cmd("check", "--json", tmp_path / "ddp.rank*.jsonl")
    report = json.loads(result.stdout)
    # the ranks agree; the one problem is the script's: `extra` is never called, on any rank
    assert [(f["cause"], f["module"], f["ranks"]) for f in report["findings"]] == [
        ("unused", "extra", None)]


@pytest.mark.slow
def test_rank_taking_another_branch_at_step_2_is_found(tmp_path: Path) -> None:
    result = _torchrun(tmp_path, 2, "--diverge", "1")
    assert result.returncode == 0, result.stderr
    checked = hooktrace_cmd("check", "--json", tmp_path / "ddp.rank0.jsonl",
                            tmp_path / "ddp.rank1.jsonl")
    assert checked.returncode == 1
    report = json.loads(checked.stdout)
    divergence = [f for f in report["findings"] if f["cause"] == "rank-divergence"]
    assert len(divergence) == 1
    found = divergence[0]
    # rank 1 ran `extra` where rank 0 went on to fc2: step 2, second forward event
    assert (found["severity"], found["step"], found["module"]) == ("error", 2, "extra")
    assert found["evidence"]["position"] == 1
    assert found["evidence"]["ranks"]["1"].startswith("forward of extra call 0")
    assert found["evidence"]["ranks"]["0"].startswith("forward of fc2 call 0")
    # rank-local: only rank 0 never called `extra`
    unused = [f for f in report["findings"] if f["cause"] == "unused"]
    assert [(f["module"], f["ranks"]) for f in unused] == [("extra", [0])]
    text = hooktrace_cmd("check", tmp_path / "ddp.rank*.jsonl").stdout
    assert "[rank-divergence] extra · model 'model' · step 2 · ranks 0, 1" in text
    # render --rank draws one rank; rank 1 has the extra module at step 2
    drawn = hooktrace_cmd("render", "--format", "dot", "--step", "2", "--rank", "1",
                          "-o", tmp_path / "r1.dot", tmp_path / "ddp.rank*.jsonl")
    assert drawn.returncode == 0, drawn.stderr
    assert "extra" in (tmp_path / "r1.dot").read_text()


def test_logs_of_different_runs_are_refused(tmp_path: Path) -> None:
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    for log in (first, second):
        assert hooktrace_cmd("run", "-o", log, SCRIPT, "--steps", "1").returncode == 0
    for command in ("check", "render"):
        result = hooktrace_cmd(command, first, second)
        assert result.returncode == 2
        assert result.stderr.strip() == (
            "hooktrace: error: the logs are not the ranks of one run: two logs are rank 0")


@pytest.mark.slow
def test_fsdp2_sharded_gradients(tmp_path: Path) -> None:
    """FSDP2: parameter gradients are DTensors. Each rank logs the norm of its own shard (the
    full norm would take collectives inside the tracer), so the ranks' shard norms add up, as
    squares, to the full norm the script computes."""
    result = _torchrun(tmp_path, 2, script=ROOT / "tests" / "scripts" / "fsdp_train.py",
                       log="fsdp.jsonl")
    assert result.returncode == 0, result.stderr
    assert "internal error" not in result.stderr
    full = {d["step"]: d["norms"] for d in map(json.loads, result.stdout.splitlines())}
    shards: dict[tuple[int, str], list[float]] = {}
    for rank in (0, 1):
        records = read_log(tmp_path / f"fsdp.rank{rank}.jsonl")
        end = records[-1]
        assert isinstance(end, schema.End) and (end.steps, end.tracer_error) == (3, None)
        for r in records:
            if isinstance(r, schema.ParamGrads):
                for name, norm in r.grad_norm.items():
                    assert norm is not None, (rank, r)
                    shards.setdefault((r.step, name), []).append(norm)
    assert sorted(shards) == [(step, name) for step in range(3) for name in ("0", "2")]
    for (step, name), norms in shards.items():
        assert len(norms) == 2
        assert math.isclose(math.hypot(*norms), full[step][name], rel_tol=2e-3), (
            step, name, norms, full[step])
    report = hooktrace_cmd("check", "--json", tmp_path / "fsdp.rank*.jsonl")
    assert json.loads(report.stdout)["findings"] == []


def _rank_log(path: Path, rank: int, odd_step: int | None) -> None:
    """A rank's log of 4 steps of fc1 -> fc2 (-> extra in ``odd_step``), written as the tracer
    writes one."""
    writer = LogWriter(path)
    writer.write(schema.Header(schema=schema.SCHEMA_VERSION, hooktrace="0", argv=["t.py"],
                               rank=rank, world_size=2))
    writer.write(schema.Model(0, "model", "Net"))
    for name in ("", "fc1", "fc2", "extra"):
        writer.write(schema.Module(0, name, "Linear" if name else "Net", 8, 8))
    seq = 0
    for step in range(4):
        names = ["fc1", "extra" if step == odd_step else "fc2", ""]
        first = seq + 1
        for name in names:
            seq += 1
            writer.write(schema.ForwardEvent(seq, step, 0, name, 0, [[2, 4]], ["float32"],
                                             [[2, 4]], ["float32"]))
        for i, name in enumerate(reversed(names)):
            seq += 1
            writer.write(schema.BackwardEvent(seq, step, 0, name, 0, first + 2 - i, 1, 1,
                                              [[2, 4]], [[2, 4]], False, [[1.0, 0.5]],
                                              [[1.0, 0.5]]))
        writer.write(schema.Step(step, 3, 3))
    writer.write(schema.End("ok", events=seq, steps=4))
    writer.close()


@pytest.mark.parametrize("odd_step", [1, None])
def test_check_reads_each_rank_log_once(tmp_path: Path, odd_step: int | None,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The walk that looks for the ranks' divergence feeds each rank's collector, and what it
    left (it stops at a divergence) is read after it: each log is read once, and each rank's
    findings are those of checking its log alone."""
    logs = [tmp_path / f"run.rank{rank}.jsonl" for rank in (0, 1)]
    for rank, log in enumerate(logs):
        _rank_log(log, rank, odd_step if rank == 1 else None)
    alone = [run_checks(log) for log in logs]
    reads: list[Path] = []
    blocks = LogReader._blocks

    def counted(reader: LogReader) -> Iterator[list[bytes]]:
        reads.append(reader.path)
        return blocks(reader)

    monkeypatch.setattr(LogReader, "_blocks", counted)  # our reader, counted: no mock
    report = run_checks_ranks(logs)
    assert sorted(reads) == logs
    assert report.events == sum(r.events for r in alone) == 48
    divergence = [(f.step, f.module) for f in report.findings if f.cause == "rank-divergence"]
    assert divergence == ([] if odd_step is None else [(1, "extra")])
    expected: dict[tuple[str, str, int | None], list[int]] = {}
    for rank, alone_report in enumerate(alone):
        for f in alone_report.findings:
            expected.setdefault((f.cause, f.module, f.step), []).append(rank)
    assert {(f.cause, f.module, f.step): f.ranks or [0, 1] for f in report.findings
            if f.cause != "rank-divergence"} == expected
    assert (odd_step is None) == (expected.get(("unused", "extra", None)) == [0, 1])
