"""Compiled training traced, and a run hooktrace did not see never "No problems found". Real
``hooktrace run`` subprocesses.

A tiny nanoGPT-shaped model (``scripts/compiled_train.py``: embeddings, causal attention, MLP,
tied head, AdamW) compiled three ways (``torch.compile(model)``, ``model.compile()`` with
``fullgraph=True, dynamic=True``, a compiled function calling the model), and torchvision's
resnet18 compiled (BatchNorm buffers, in-place ReLUs): their recorded steps have the eager
run's events (names, order, shapes), their losses are the untraced run's, and the steps after
the recorded ones ran the compiled graph (the script counts the compiled graph's calls through
its backend). A ``.detach()`` inside the compiled model is named. Most
cases compile with ``aot_eager`` (fast on a CPU); two with inductor, one of them
``mode="max-autotune-no-cudagraphs"``. Then the runs nothing was
seen in: a script that exits in argument parsing, one without an ``nn.Module``, a compiled
model run only in unrecorded steps.
"""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from helpers import Shared, events, hooktrace_cmd, read_log

from hooktrace.log import schema

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
TRAIN = SCRIPTS / "compiled_train.py"
STEPS = 6  # 4 recorded (--steps 0:4), 2 compiled
RECORDED = ("--steps", "0:4")
HOWS = ("eager", "model", "method", "function")
LONG = 16  # steps of the runs with a NaN from step 14 on


def _losses(stdout: str) -> list[float]:
    return [float(line.split()[-1]) for line in stdout.splitlines() if line.startswith("step ")]


def _counters(stdout: str) -> dict[str, Any]:
    line = next(x for x in stdout.splitlines() if x.startswith("counters "))
    return dict(json.loads(line.partition(" ")[2]))


@pytest.fixture(scope="session")
def runs(shared: Shared) -> dict[str, Any]:
    """Each case traced and checked, and the untraced runs, two at a time: once per test run
    (``shared``)."""
    made = shared("compiled", _make_runs)
    return {name: (Path(made["folder"]) / f"{name}.jsonl",
                   *(subprocess.CompletedProcess(*r) for r in result))
            for name, result in made["runs"].items()}


def _make_runs(tmp: Path) -> dict[str, list[Any]]:
    def traced(case: str, *args: str) -> list[Any]:
        log = tmp / f"{case}.jsonl"
        return [hooktrace_cmd("run", "-o", log, *RECORDED, TRAIN, *args),
                hooktrace_cmd("check", "--json", log)]

    def plain(case: str, *args: str) -> list[Any]:
        return [subprocess.run([sys.executable, str(TRAIN), *args], capture_output=True,
                               text=True, timeout=300, check=True)]

    cases: dict[str, Any] = {
        how: (traced, "--how", how, "--steps", str(STEPS)) for how in HOWS}
    cases["method"] = (*cases["method"], "--fullgraph")  # fullgraph=True, dynamic=True too
    cases["detach"] = (traced, "--how", "model", "--bug", "detach", "--steps", "3")
    for bug in ("nan", "mask"):  # from step 14, past the recorded steps
        cases[bug] = (traced, "--how", "model", "--bug", bug, "--steps", str(LONG))
    cases["mask-eager"] = (traced, "--how", "eager", "--bug", "mask", "--steps", str(LONG))
    inductor = ("--how", "model", "--model", "mlp", "--backend", "inductor", "--steps", "5")
    cases["inductor"] = (traced, *inductor)
    cases["autotune"] = (traced, *inductor, "--mode", "max-autotune-no-cudagraphs")
    resnet = ("--model", "resnet18", "--steps", str(STEPS))
    cases["resnet18"] = (traced, "--how", "model", *resnet)
    cases["resnet18-eager"] = (traced, "--how", "eager", *resnet)
    cases["plain-resnet18"] = (plain, "--how", "model", *resnet)
    cases["plain"] = (plain, "--how", "model", "--steps", str(STEPS))
    cases["plain-inductor"] = (plain, *inductor)
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {name: pool.submit(f, name, *args) for name, (f, *args) in cases.items()}
        return {"folder": str(tmp), "runs": {
            name: [[r.args, r.returncode, r.stdout, r.stderr] for r in future.result()]
            for name, future in futures.items()}}


def _signature(log: Path) -> list[tuple[Any, ...]]:
    """Each event's phase, step, module, call and shapes, in order."""
    return [(e.phase, e.step, e.fqn, e.call,
             e.input_shapes if isinstance(e, schema.ForwardEvent) else e.grad_output_shapes)
            for e in events(log)]


@pytest.mark.parametrize("how", HOWS[1:])
def test_recorded_steps_of_compiled_code_are_the_eager_runs(runs: dict[str, Any],
                                                            how: str) -> None:
    log, run, check = runs[how]
    assert run.returncode == 0, run.stderr
    eager_log = runs["eager"][0]
    assert _signature(log) == _signature(eager_log)
    assert len({e.step for e in events(log)}) == 4
    assert read_log(log)[0].eager  # type: ignore[union-attr]
    # the printed losses are the untraced compiled run's
    assert _losses(run.stdout) == pytest.approx(_losses(runs["plain"][1].stdout), rel=1e-5)
    counters = _counters(run.stdout)
    assert counters["graph_calls"] == STEPS - 4  # the steps after the recorded ones: compiled
    assert counters["recompiles"] == 0
    assert counters["stats"]["unique_graphs"] == 1
    # check says it once, as a note; nothing else
    assert check.returncode == 0, check.stdout
    found = json.loads(check.stdout)["findings"]
    assert [(f["cause"], f["severity"]) for f in found] == [("compiled-eager", "note")]
    assert "next: hooktrace render" in run.stderr


def test_a_compiled_resnet18_is_traced_as_its_eager_run(runs: dict[str, Any]) -> None:
    """BatchNorm buffers and in-place ReLUs inside the compiled graph: the recorded steps have
    the eager run's events, the losses are the untraced compiled run's, the later steps ran
    the compiled graph, and tracing compiled nothing again."""
    log, run, check = runs["resnet18"]
    assert run.returncode == 0, run.stderr
    assert _signature(log) == _signature(runs["resnet18-eager"][0])
    assert len({e.step for e in events(log)}) == 4
    assert _losses(run.stdout) == pytest.approx(_losses(runs["plain-resnet18"][1].stdout),
                                                rel=1e-5)
    counters = _counters(run.stdout)
    assert (counters["graph_calls"], counters["recompiles"]) == (STEPS - 4, 0)
    assert counters["stats"]["unique_graphs"] == 1
    assert _counters(runs["plain-resnet18"][1].stdout)["graph_calls"] == STEPS
    assert check.returncode == 0, check.stdout
    found = json.loads(check.stdout)["findings"]
    assert sorted((f["cause"], f["severity"]) for f in found) == [
        ("called-several-times", "note"), ("compiled-eager", "note")]  # each block's relu x2


def test_untraced_runs_compile_every_step(runs: dict[str, Any]) -> None:
    counters = _counters(runs["plain"][1].stdout)
    assert (counters["graph_calls"], counters["stats"]["unique_graphs"]) == (STEPS, 1)


def test_a_detach_inside_a_compiled_model_is_named(runs: dict[str, Any]) -> None:
    _, run, check = runs["detach"]
    assert run.returncode == 0, run.stderr
    assert check.returncode == 1
    found = json.loads(check.stdout)["findings"]
    lost = [f for f in found if f["severity"] != "note"]
    assert [(f["cause"], f["module"]) for f in lost] == [("no-grad", "h.0"), ("no-grad", "h.1")]
    assert lost[0]["evidence"]["starved"] == ["h.0.ln_1", "h.0.attn.qkv", "h.0.attn.proj"]
    assert "at .detach() (" in lost[0]["message"]  # the op zoom of a later step found the line


def test_inductor_recorded_steps_eager_then_compiled(runs: dict[str, Any]) -> None:
    _, run, check = runs["inductor"]
    assert run.returncode == 0, run.stderr
    assert _losses(run.stdout) == pytest.approx(_losses(runs["plain-inductor"][1].stdout),
                                                rel=1e-5)
    assert _counters(run.stdout)["graph_calls"] == 1
    assert _counters(runs["plain-inductor"][1].stdout)["graph_calls"] == 5
    assert check.returncode == 0, check.stdout


def test_max_autotune_without_cuda_graphs_recorded_eager_then_compiled(
        runs: dict[str, Any]) -> None:
    _, run, check = runs["autotune"]
    assert run.returncode == 0, run.stderr
    assert _losses(run.stdout) == pytest.approx(_losses(runs["plain-inductor"][1].stdout),
                                                rel=1e-5)
    assert (_counters(run.stdout)["graph_calls"], _counters(run.stdout)["recompiles"]) == (1, 0)
    assert check.returncode == 0, check.stdout
    found = json.loads(check.stdout)["findings"]
    assert [(f["cause"], f["severity"]) for f in found] == [("compiled-eager", "note")]


def _problems(check: subprocess.CompletedProcess[str]) -> list[tuple[Any, ...]]:
    found = json.loads(check.stdout)["findings"]
    return [(f["cause"], f["module"], f["step"]) for f in found if f["severity"] != "note"]


def test_a_nan_in_a_watched_compiled_step_is_found_at_its_step_with_its_module(
        runs: dict[str, Any]) -> None:
    """Weights set to NaN before step 14, which runs compiled: the step's gradients are
    judged when backward() returns, and the module whose weights are NaN is named."""
    log, run, check = runs["nan"]
    assert run.returncode == 0, run.stderr
    assert _problems(check)[0] == ("nonfinite-forward", "h.1.mlp.0", 14)
    assert check.returncode == 1
    assert "steps 4-13 ran compiled" in json.loads(check.stdout)["findings"][0]["message"]
    assert read_log(log)[-1].steps == LONG  # type: ignore[union-attr]
    assert _counters(run.stdout)["graph_calls"] == LONG - 4  # every watched step compiled


def test_a_nan_from_functional_code_in_a_compiled_step_is_named_by_the_next_step_run_eagerly(
        runs: dict[str, Any]) -> None:
    """A mask that hides every key from step 14 on (the loop skips the optimizer step of a
    NaN loss): step 14 runs compiled and finds NaN gradients, step 15 runs eagerly and names
    the module the eager run names at step 14."""
    log, run, check = runs["mask"]
    assert run.returncode == 0, run.stderr
    eager = _problems(runs["mask-eager"][2])
    assert eager[0][1:] == ("h.0.attn.proj", 14)
    assert _problems(check) == [eager[0]]
    (anomaly,) = [r for r in read_log(log) if isinstance(r, schema.Anomaly)]
    assert anomaly.detail["named_in"] == 15
    assert _counters(run.stdout)["graph_calls"] == LONG - 4 - 1  # step 15 ran eagerly


def test_a_later_steps_range_is_recorded_once_the_compiled_steps_before_it_ran(
        tmp_path: Path) -> None:
    """Compiled steps are counted at backward()'s return: ``--steps 0,6`` records step 6."""
    log = tmp_path / "later.jsonl"
    run = hooktrace_cmd("run", "-o", log, "--steps", "0,6", TRAIN, "--model", "mlp",
                        "--steps", "8")
    assert run.returncode == 0, run.stderr
    assert sorted({e.step for e in events(log)}) == [0, 6]
    assert _counters(run.stdout)["graph_calls"] == 6  # steps 1-5 and 7


# -- runs hooktrace did not see --------------------------------------------------------------

def _unseen(tmp_path: Path, script: Path, *args: str, options: tuple[str, ...] = (),
            status: int = 0) -> tuple[str, dict[str, Any]]:
    """run's closing line and check's one finding, a nothing-traced error (check exits 1)."""
    log = tmp_path / "log.jsonl"
    run = hooktrace_cmd("run", "-o", log, *options, script, *args)
    assert run.returncode == status, run.stderr
    last = run.stderr.splitlines()[-1]
    assert "next: hooktrace render" not in run.stderr
    check = hooktrace_cmd("check", "--json", log)
    assert check.returncode == 1, check.stdout
    (found,) = json.loads(check.stdout)["findings"]
    assert (found["cause"], found["severity"]) == ("nothing-traced", "error")
    assert last == f"hooktrace: nothing traced: {found['message']}"
    return last, found


def test_a_script_that_exits_in_argument_parsing(tmp_path: Path) -> None:
    last, _ = _unseen(tmp_path, SCRIPTS / "needs_args.py", status=2)
    assert last.startswith("hooktrace: nothing traced: the script exited with status 2 before "
                           "any model ran (")
    assert last.endswith("needs_args.py:11: args = parser.parse_args())")


def test_a_script_without_a_module(tmp_path: Path) -> None:
    last, found = _unseen(tmp_path, SCRIPTS / "no_module.py")
    assert "backward() ran 3 times but no nn.Module call was seen" in last
    _, found = _unseen(tmp_path, SCRIPTS / "no_module.py", "--no-backward")
    assert found["message"] == ("the script finished without calling any nn.Module: nothing "
                                "to check")


def test_a_compiled_model_run_only_where_steps_are_not_recorded(tmp_path: Path) -> None:
    """--steps past the run: the compiled model ran compiled throughout, unseen, and says so."""
    _, found = _unseen(tmp_path, TRAIN, "--steps", "2", "--model", "mlp",
                       options=("--steps", "5:"))
    assert found["message"].startswith("torch.compile'd code ran (")


def test_calls_all_left_out_by_include(tmp_path: Path) -> None:
    _, found = _unseen(tmp_path, SCRIPTS / "needs_args.py", "--data", "x",
                       options=("--include", "nothing*"))
    assert found["message"].startswith("every module call was left out by --include nothing*")
