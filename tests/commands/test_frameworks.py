"""Real training frameworks traced unmodified by ``hooktrace run``: Lightning, HF Trainer, generate.

The scripts in tests/scripts/ use the real ``lightning`` and ``transformers`` packages on tiny
randomly initialised models (no download, CPU, 3 steps); a test is skipped when its package is
not installed. Each script exits with the status given as its argument, after training.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path

import pytest
from helpers import events, hooktrace_cmd, read_log

from hooktrace.log import schema

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
OFFLINE = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
Traced = tuple[subprocess.CompletedProcess[str], Path]

# a GPT-2 block's module calls, in forward order
BLOCK = ["ln_1", "attn.c_attn", "attn.c_proj", "attn.resid_dropout", "attn", "ln_2",
         "mlp.c_fc", "mlp.act", "mlp.c_proj", "mlp.dropout", "mlp", ""]


def gpt2_forward(layers: int) -> list[str]:
    blocks = [f"transformer.h.{i}" + (f".{name}" if name else "")
              for i in range(layers) for name in BLOCK]
    return ["transformer.wte", "transformer.wpe", "transformer.drop", *blocks,
            "transformer.ln_f", "transformer", "lm_head", ""]


def traced(package: str, script: str, tmp: Path, *args: str) -> Traced:
    if importlib.util.find_spec(package) is None:  # importorskip would import it: seconds
        pytest.skip(f"{package} is not installed")
    log = tmp / f"{script}.jsonl"
    done = hooktrace_cmd("run", "-o", log, SCRIPTS / f"{script}.py", *args, cwd=tmp,
                         env=OFFLINE)
    return done, log


def models(path: Path) -> list[tuple[int, str, str]]:
    return [(r.model, r.name, r.cls) for r in read_log(path) if isinstance(r, schema.Model)]


def steps(path: Path) -> list[tuple[int, int, int]]:
    return [(r.step, r.forward, r.backward) for r in read_log(path) if isinstance(r, schema.Step)]


def check(path: Path) -> tuple[int, list[tuple[str, str, str, str]]]:
    """``hooktrace check --json``: its exit status and findings (kind, severity, model, module)."""
    done = hooktrace_cmd("check", "--json", path)
    findings = json.loads(done.stdout)["findings"]
    return done.returncode, [(f["cause"], f["severity"], f["model"], f["module"])
                             for f in findings]


@pytest.fixture(scope="module")
def lightning_run(tmp_path_factory: pytest.TempPathFactory) -> Traced:
    return traced("lightning", "lightning_train", tmp_path_factory.mktemp("lightning"), "5")


def test_lightning_exit_status_and_steps(lightning_run: Traced) -> None:
    done, log = lightning_run
    assert done.returncode == 5, done.stderr
    assert "trained 3 steps" in done.stdout
    assert steps(log) == [(0, 5, 5), (1, 5, 5), (2, 5, 5)]


def test_lightning_training_step_modules_named_under_the_lightning_module(
        lightning_run: Traced) -> None:
    _, log = lightning_run
    assert models(log) == [(0, "classifier", "Classifier")]
    assert [r.fqn for r in read_log(log) if isinstance(r, schema.Module)] == [
        "", "net", "net.0", "net.1", "net.2", "loss"]
    for step in range(3):
        assert [e.fqn for e in events(log, "forward", step)] == [
            "net.0", "net.1", "net.2", "net", "loss"]
        assert [e.fqn for e in events(log, "backward", step)] == [
            "loss", "net", "net.2", "net.1", "net.0"]


def test_lightning_check_finds_no_problem(lightning_run: Traced) -> None:
    status, findings = check(lightning_run[1])
    assert status == 0
    assert [f for f in findings if f[1] != "note"] == []


def test_lightning_check_is_clean(lightning_run: Traced) -> None:
    assert check(lightning_run[1]) == (0, [])


@pytest.fixture(scope="module")
def trainer_run(tmp_path_factory: pytest.TempPathFactory) -> Traced:
    return traced("transformers", "hf_trainer_train", tmp_path_factory.mktemp("trainer"), "3")


def test_hf_trainer_exit_status_names_and_steps(trainer_run: Traced) -> None:
    done, log = trainer_run
    assert done.returncode == 3, done.stderr
    assert "trained 3 steps" in done.stdout
    assert models(log) == [(0, "model", "GPT2LMHeadModel")]
    assert steps(log) == [(0, 31, 31), (1, 31, 31), (2, 31, 31)]
    for step in range(3):
        assert [e.fqn for e in events(log, "forward", step)] == gpt2_forward(2)
        assert [e.fqn for e in events(log, "backward", step)] == gpt2_forward(2)[::-1]


def test_hf_trainer_check_clean(trainer_run: Traced) -> None:
    # transformers' attention applies its dropout functionally: attn_dropout is truly unused
    assert check(trainer_run[1]) == (0, [
        ("unused", "note", "model", "transformer.h.0.attn.attn_dropout")])


def test_generate_is_one_model_with_the_usual_fqns(tmp_path: Path) -> None:
    done, log = traced("transformers", "hf_generate", tmp_path)
    assert done.returncode == 0, done.stderr
    assert "generated 3 tokens" in done.stdout
    assert models(log) == [(0, "lm", "GPT2LMHeadModel")]
    forward = events(log, "forward")
    assert [(e.fqn, e.call) for e in forward] == [
        (name, call) for call in range(3) for name in gpt2_forward(1)]
    assert all(e.no_grad for e in forward)
    assert events(log, "backward") == []
    status, findings = check(log)
    assert (status, [f for f in findings if f[1] != "note"]) == (0, [])
