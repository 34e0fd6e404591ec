"""The data flow of the field programs (tests/scripts/field_flow.py, issue 47 item 4), traced for
real and read back as ``show --edges`` and ``render``'s picture laid out by the real ``dot``:
edges through operations under ``no_grad``, where autograd records nothing (a ``cat``, a
residual add), none from a module that returned its input to a later reader of that input,
and the backward's start at every head the loss reaches."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from helpers import Traced, hooktrace_cmd

from tests.commands.test_field_pictures import dot_of, plain

SCRIPT = Path(__file__).parent.parent / "scripts" / "field_flow.py"

needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="needs Graphviz dot")


def forward_edges(log: Path, step: int) -> list[str]:
    """``show --edges``'s forward edges of ``step`` at depth 3, without their numbers."""
    result = hooktrace_cmd("show", "--edges", "--depth", "3", "--step", str(step), log)
    assert result.returncode == 0, result.stderr
    text = result.stdout.split("forward: ", 1)[1].split("backward: ", 1)[0]
    return [line.split(None, 1)[1] for line in text.splitlines()[1:] if line.strip()]


def test_sac_critics_are_fed_through_cat_under_no_grad(traced: Traced) -> None:
    """The target's ``cat`` of its extractor's features and the actor's next actions, under
    ``no_grad``, and the trained critic's ``cat`` of its features and the replay actions, none
    needing a gradient, with gradient recording on (before: no edge into either Q network;
    then the second one only, under ``no_grad``); the actor's extractor returned the
    observations unchanged, and the critics read their own (before:
    ``actor:features -> critic_target:features``, and in the actor's pass
    ``actor:features -> critic:features``). Not drawn, as before: the critic's ``cat`` with
    actions that need a gradient (autograd's, which sees no tensor without history)."""
    log = traced(SCRIPT, "critics")
    assert forward_edges(log, 0) == [
        "actor:features -> actor:mu",
        "actor:mu -> critic_target:qf0.0", "critic_target:features -> critic_target:qf0.0",
        "critic_target:qf0.0 -> critic_target:qf0.1",
        "critic_target:qf0.1 -> critic_target:qf0.2",
        "actor:mu -> critic_target:qf1.0", "critic_target:features -> critic_target:qf1.0",
        "critic_target:qf1.0 -> critic_target:qf1.1",
        "critic_target:qf1.1 -> critic_target:qf1.2",
        "critic:features -> critic:qf0.0",
        "critic:qf0.0 -> critic:qf0.1", "critic:qf0.1 -> critic:qf0.2",
        "critic:features -> critic:qf1.0",
        "critic:qf1.0 -> critic:qf1.1", "critic:qf1.1 -> critic:qf1.2",
    ]
    assert forward_edges(log, 1) == [  # the actor's actions need a gradient: autograd's cat
        "actor:features -> actor:mu",
        "actor:mu -> critic:qf0.0",
        "critic:qf0.0 -> critic:qf0.1", "critic:qf0.1 -> critic:qf0.2",
        "actor:mu -> critic:qf1.0",
        "critic:qf1.0 -> critic:qf1.1", "critic:qf1.1 -> critic:qf1.2",
    ]


def test_an_extractor_that_reshapes_feeds_what_reads_its_view(traced: Traced) -> None:
    """The healthy look-alike: on 1x2x4 observations each ``Flatten`` makes a view, which its
    own model reads: the same edges, none between the extractors."""
    log = traced(SCRIPT, "critics_image")
    assert forward_edges(log, 0) == forward_edges(traced(SCRIPT, "critics"), 0)
    assert [e for e in forward_edges(log, 1) if e.endswith(":features")] == []


def test_validation_under_no_grad_has_the_training_call_s_edges(traced: Traced) -> None:
    """llm.c validates at step 0 under ``no_grad`` before training: the validation call of the
    GPT gets the edges of the training call (its embeddings and residual adds: before, only
    the five edges from a LayerNorm into the layer that reads it)."""
    edges = forward_edges(traced(SCRIPT, "validation"), 0)
    validation = [e for e in edges if "(call 1/2)" in e]
    training = [e for e in edges if "(call 2/2)" in e]
    assert len(validation) + len(training) == len(edges)
    assert [e.replace("call 1/2", "call 2/2") for e in validation] == training
    assert {"wte (call 1/2) -> h.0.ln_1 (call 1/2)", "wpe (call 1/2) -> h.0.ln_1 (call 1/2)",
            "h.0.attn (call 1/2) -> h.1.ln_1 (call 1/2)",
            "h.1.mlp (call 1/2) -> ln_f (call 1/2)"} <= set(validation)
    assert len(validation) == 23


@needs_dot
def test_the_backward_starts_at_each_head_the_loss_reaches(traced: Traced,
                                                         tmp_path: Path) -> None:
    """A loss of the ``out`` and ``aux`` heads: the backward starts at both (before: at ``aux``
    only, autograd's first)."""
    found = plain(dot_of(traced(SCRIPT, "two_heads"), tmp_path))
    assert [e for e in found if e.startswith("start")] == [
        "start -> m0/aux_classifier#0", "start -> m0/classifier#0"]
    assert {"backward 1: m0/aux_classifier#0 -> m0/backbone.1#0",
            "backward 2: m0/classifier#0 -> m0/backbone.1#0"} <= set(found)


@needs_dot
def test_a_single_head_s_backward_starts_once(traced: Traced, tmp_path: Path) -> None:
    found = plain(dot_of(traced(SCRIPT, "one_head"), tmp_path))
    assert [e for e in found if e.startswith("start")] == ["start -> m0/classifier#0"]
