"""How much of its batch a loss reads, with masks (``hooktrace/observe/lossgraph.py``,
``check/lossterms.py``): a 0/1 mask over a per-element loss, a boolean index, ``masked_select``,
``torch.where``, and a loss computed inside the model's call (``model(ids, labels=...).loss``).
Traced in this process on a real tiny language model: each bug next to the healthy recipe it
resembles, which says the share as a note and warns of nothing."""

from __future__ import annotations

import gc
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch
from helpers import read_log
from torch import nn
from torch.nn import functional as F

import hooktrace
from hooktrace.check.checklog import run_checks
from hooktrace.log import schema

PAD = 0
# 4 sequences of 7 tokens, 7, 5, 3 and 2 of them real: 17 of 28
LENGTHS = torch.tensor([7, 5, 3, 2])
Loss = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


class Output(NamedTuple):
    logits: torch.Tensor
    loss: torch.Tensor | None


class TinyLM(nn.Module):
    """A causal LM's head: logits per token; given ``labels``, its own loss, as Hugging Face
    models compute it (``ignore_index`` -100 unless told)."""

    def __init__(self, ignore_index: int = -100) -> None:
        super().__init__()
        self.ignore_index = ignore_index
        self.embed = nn.Embedding(16, 16, padding_idx=PAD)
        self.head = nn.Linear(16, 16)

    def forward(self, ids: torch.Tensor, labels: torch.Tensor | None = None) -> Output:
        logits = self.head(torch.tanh(self.embed(ids)))
        loss = None if labels is None else F.cross_entropy(
            logits.flatten(0, 1), labels.flatten(), ignore_index=self.ignore_index)
        return Output(logits, loss)


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(1)
    ids = torch.randint(1, 16, (4, 7))
    real = torch.arange(7) < LENGTHS[:, None]
    ids = torch.where(real, ids, PAD)
    return ids, ids.roll(-1, 1)


def per_token(model: nn.Module, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = model(ids).logits
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none").view(4, 7)


def train(path: Path | None, loss_fn: Loss, steps: int = 2, model: nn.Module | None = None
          ) -> list[torch.Tensor]:
    """Trains ``model`` (a ``TinyLM``) ``steps`` steps with ``loss_fn``; its weights after."""
    torch.manual_seed(0)
    model = model or TinyLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ids, targets = batch()
    with hooktrace.trace(path) if path is not None else _nothing():
        for _ in range(steps):
            opt.zero_grad()
            loss_fn(model, ids, targets).backward()
            opt.step()
        weights = [p.detach().clone() for p in model.parameters()]
        del model, opt
        gc.collect()  # the model is gone before tracing stops
    return weights


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *_: Any) -> None:
        return None


def shares(path: Path) -> list[tuple[int, str, str, int, int]]:
    return [(r.step, r.detail["by"], r.detail["node"], r.detail["read"], r.detail["of"])
            for r in read_log(path) if isinstance(r, schema.Signal) and r.kind == "loss-share"]


def real_mask(ids: torch.Tensor) -> torch.Tensor:
    return (ids != PAD).float()


# -- healthy: a share stated as a fact, no warning -----------------------------------------------

def padding_mask(model: nn.Module, ids: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    mask = real_mask(ids)  # seq2seq padding of variable lengths
    return (per_token(model, ids, y) * mask).sum() / mask.sum()


def bool_index(model: nn.Module, ids: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return per_token(model, ids, y)[ids != PAD].mean()


def masked_select(model: nn.Module, ids: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return per_token(model, ids, y).masked_select(ids != PAD).mean()


def where(model: nn.Module, ids: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.where(ids != PAD, per_token(model, ids, y), 0.0).sum() / 17


def mlm(model: nn.Module, ids: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    chosen = torch.zeros(4, 7, dtype=torch.bool)
    chosen[0, 2] = chosen[1, 4] = chosen[2, 1] = chosen[3, 0] = True  # 4 of 28: ~15%
    return F.cross_entropy(model(ids).logits.flatten(0, 1),
                           torch.where(chosen, y, -100).flatten())


HEALTHY = {  # case -> the share signal at step 0 (by, op, read, of)
    "padding_mask": (padding_mask, ("mask", "Mul", 17, 28)),
    "bool_index": (bool_index, ("mask", "Index", 17, 28)),
    "masked_select": (masked_select, ("mask", "MaskedSelect", 17, 28)),
    "where": (where, ("mask", "Where", 17, 28)),
}


@pytest.mark.parametrize("case", sorted(HEALTHY))
def test_the_share_a_mask_keeps_is_a_fact(tmp_path: Path, case: str) -> None:
    loss_fn, share = HEALTHY[case]
    path = tmp_path / "log.jsonl"
    train(path, loss_fn)
    assert shares(path) == [(0, *share), (1, *share)]
    report = run_checks(path)
    assert report.problems == []
    [note] = [f for f in report.findings if f.cause == "loss-share"]
    assert note.model == "model" and "reads 17 of its 28 elements (60%)" in note.message


def focal(model: nn.Module, ids: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    ce = per_token(model, ids, y)
    return ((1 - torch.exp(-ce)) ** 2 * ce).mean()  # a weight with gradient


def class_weighted(model: nn.Module, ids: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    # a weight per element, 0 at the padding: not a 0/1 mask, though it keeps 17 of 28
    weight = (0.5 + y % 3) * real_mask(ids)
    return (per_token(model, ids, y) * weight).mean()


def label_smoothing(model: nn.Module, ids: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(ids).logits.flatten(0, 1), y.flatten(), label_smoothing=0.1)


def all_ones(model: nn.Module, ids: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    mask = torch.ones(4, 7)
    return (per_token(model, ids, y) * mask).sum() / mask.sum()


@pytest.mark.parametrize("loss_fn", [focal, class_weighted, label_smoothing, all_ones])
def test_weights_and_full_batches_say_nothing(tmp_path: Path, loss_fn: Loss) -> None:
    path = tmp_path / "log.jsonl"
    train(path, loss_fn)
    assert shares(path) == []
    assert run_checks(path).findings == []


def test_mlm_masking_is_a_note(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    train(path, mlm)
    report = run_checks(path)
    assert report.problems == []
    [note] = [f for f in report.findings if f.cause == "loss-share"]
    assert "4 of 28 targets" in note.message


# -- the bugs -----------------------------------------------------------------------------------

def mask_from_a_wrong_comparison(model: nn.Module, ids: torch.Tensor, y: torch.Tensor
                                 ) -> torch.Tensor:
    mask = (ids == -1).float()  # meant ids != PAD: no token is -1
    return (per_token(model, ids, y) * mask).sum() / mask.sum().clamp(min=1)


def mask_of_the_wrong_dtype(model: nn.Module, ids: torch.Tensor, y: torch.Tensor
                            ) -> torch.Tensor:
    keep = (LENGTHS > 2).long()  # 1, 1, 1, 0 as a long: an index, rows 1, 1, 1, 0
    return per_token(model, ids, y)[keep].mean()


def test_a_mask_that_keeps_nothing_is_a_finding(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    train(path, mask_from_a_wrong_comparison)
    assert shares(path) == [(0, "mask", "Mul", 0, 28), (1, "mask", "Mul", 0, 28)]
    [problem] = run_checks(path).problems
    assert (problem.cause, problem.model, problem.step) == ("loss-reads-nothing", "model", 0)
    assert "none of its 28 elements" in problem.message and "loss * mask" in problem.message


def test_an_integer_mask_used_as_an_index_is_a_finding(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    train(path, mask_of_the_wrong_dtype)
    assert shares(path) == [(0, "index", "Index", 14, 28), (1, "index", "Index", 14, 28)]
    [problem] = run_checks(path).problems
    assert (problem.cause, problem.model, problem.step) == ("loss-mask-index", "model", 0)
    assert "rows 0 and 1" in problem.message and "14 of its 28" in problem.message


def test_a_permutation_index_is_not_a_mask(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    train(path, lambda model, ids, y: per_token(model, ids, y)[torch.tensor([3, 1, 0, 2])]
          .mean())
    assert shares(path) == []
    assert run_checks(path).findings == []


# -- a loss computed inside the model's call ----------------------------------------------------

def inside(model: nn.Module, ids: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    labels = torch.where(ids.roll(-1, 1) != PAD, y, -100)
    loss: torch.Tensor = model(ids, labels=labels).loss
    return loss


def test_a_loss_inside_the_model_call_states_its_share(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    train(path, inside)
    ignored = [(0, "ignore_index", "NllLoss", 17, 28), (1, "ignore_index", "NllLoss", 17, 28)]
    assert shares(path) == ignored
    report = run_checks(path)
    assert report.problems == []
    [note] = [f for f in report.findings if f.cause == "loss-share"]
    assert "inside the model's call" in note.message and "17 of 28 targets" in note.message


def test_an_ignore_index_that_matches_every_target_inside_the_model(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    train(path, lambda model, ids, y: model(ids, labels=torch.full_like(y, PAD)).loss,
          model=TinyLM(ignore_index=PAD))  # labels made of the padding id only
    problems = run_checks(path).problems  # the loss is NaN: a mean over no target
    assert [(p.cause, p.model) for p in problems] == [("nonfinite-forward", "model"),
                                                     ("loss-reads-nothing", "model")]
    message = problems[1].message
    assert message.startswith("F.cross_entropy inside the model's call") and \
        "ignore_index=0" in message and "the gradient of embed, head is exactly zero" in message


# -- tracing changes nothing --------------------------------------------------------------------

@pytest.mark.parametrize("loss_fn", [padding_mask, mask_of_the_wrong_dtype, inside])
def test_tracing_changes_nothing(tmp_path: Path, loss_fn: Loss) -> None:
    untraced, traced = train(None, loss_fn, 3), train(tmp_path / "log.jsonl", loss_fn, 3)
    assert all(torch.equal(a, b) for a, b in zip(untraced, traced, strict=True))


def test_saved_tensors_behind_an_unpack_hook_are_not_unpacked(tmp_path: Path) -> None:
    unpacked: list[int] = []

    def offloaded(model: nn.Module, ids: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with torch.autograd.graph.saved_tensors_hooks(
                lambda t: t, lambda t: unpacked.append(1) or t):  # type: ignore[func-returns-value]
            return padding_mask(model, ids, y)

    train(None, offloaded)
    untraced = len(unpacked)
    path = tmp_path / "log.jsonl"
    train(path, offloaded)
    assert len(unpacked) == 2 * untraced  # the program's own unpacks, no more
    assert shares(path) == []
