"""Who may see whom (``--probe``, ``observe/seeing.py``) on real models: what it measures on
blind set 5's models and their look-alikes, and that a probed run changes nothing: the same
losses, weights, gradients, BatchNorm statistics and random numbers bit for bit, the user's
hooks not run by the copy."""

from __future__ import annotations

import contextlib
import copy
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import read_log
from torch import nn
from torch.nn import functional as F

import hooktrace
from hooktrace.log import schema
from hooktrace.observe.seeing import probe

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import blind_bugs5 as blind


def _next_ids() -> torch.Tensor:
    return torch.randint(0, 16, (4, 7))[:, :-1]  # next-step input: ids[:, :-1]


def _next_seq() -> torch.Tensor:
    return torch.randn(4, 7, 4).cumsum(1)[:, :-1]


# model, its input -> (what, verdict) of each fact, and the module the fact names
MODELS: dict[str, tuple[Callable[[], nn.Module], Callable[[], torch.Tensor],
                        list[tuple[str, str, str]]]] = {
    "view_mixes_samples": (lambda: blind.RNNClassifier(False), lambda: blind.seq_data()[0],
                           [("batch", "some", "")]),
    "ok_permute_then_reshape": (lambda: blind.RNNClassifier(True), lambda: blind.seq_data()[0],
                                [("batch", "apart", "")]),
    "batchnorm": (lambda: blind.Encoder(nn.BatchNorm1d(16)), lambda: torch.randn(16, 8),
                  [("batch", "all", "net.1")]),
    "groupnorm": (lambda: blind.Encoder(nn.GroupNorm(4, 16)), lambda: torch.randn(16, 8),
                  [("batch", "apart", "")]),
    "mean_pool_over_padding": (lambda: blind.Pooler(False), blind.padded_ids,
                               [("batch", "apart", ""), ("padding", "leaks", "")]),
    "ok_masked_mean_pool": (lambda: blind.Pooler(True), blind.padded_ids,
                            [("batch", "apart", ""), ("padding", "holds", "")]),
    "causal_mask_flipped": (lambda: blind.TinyLM("flipped"), _next_ids,
                            [("batch", "apart", ""), ("causal", "leaks", "attn")]),
    "causal_mask_off_by_one": (lambda: blind.TinyLM("off_by_one"), _next_ids,
                               [("batch", "apart", ""), ("causal", "leaks", "attn")]),
    "ok_causal_mask": (lambda: blind.TinyLM("causal"), _next_ids,
                       [("batch", "apart", ""), ("causal", "holds", "attn")]),
    "key_padding_mask_inverted": (lambda: blind.PadAttention(True), blind.pad_ids,
                                  [("batch", "apart", ""), ("padding", "leaks", "attn")]),
    "ok_key_padding_mask": (lambda: blind.PadAttention(False), blind.pad_ids,
                            [("batch", "apart", ""), ("padding", "holds", "")]),
    "encoder_without_causal_mask": (lambda: blind.NextStep(False), _next_seq,
                                    [("batch", "apart", ""), ("causal", "leaks", "encoder")]),
    "ok_encoder_causal": (lambda: blind.NextStep(True), _next_seq,
                          [("batch", "apart", ""), ("causal", "holds", "encoder")]),
}


@pytest.mark.parametrize("case", sorted(MODELS))
def test_what_the_probe_measures(case: str) -> None:
    torch.manual_seed(0)
    make, data, expected = MODELS[case]
    facts = probe(make(), (data(),), {})
    assert [(f["what"], f["verdict"], f.get("module", "")) for f in facts] == expected


def test_the_measures_say_which_positions() -> None:
    torch.manual_seed(0)
    flipped, off = (probe(blind.TinyLM(m), (_next_ids(),), {})[1] for m in
                    ("flipped", "off_by_one"))
    assert (flipped["masks"], flipped["position"], flipped["sees"]) == (
        {"attn_mask": "torch.tril(ones, -1)"}, 0, [1, 2, 3, 4, 5])
    assert (off["masks"], off["position"], off["sees"]) == (
        {"attn_mask": "torch.triu(ones, 2)"}, 0, [1])
    view = probe(blind.RNNClassifier(False), (blind.seq_data()[0],), {})[0]
    assert (view["axis"], view["sample"], view["sees"]) == (1, 0, [1, 2, 3, 4])
    inverted = probe(blind.PadAttention(True), (blind.pad_ids(),), {})[1]
    assert inverted["masks"] == [{"module": "attn", "arg": "key_padding_mask",
                                  "reads": "inverted", "hidden": 48 - inverted["padded"]}]


class Seq2Seq(nn.Module):
    """nn.Transformer: its first input is the encoder's source, its tgt_mask orders the
    target's positions."""

    def __init__(self, mask: str) -> None:
        super().__init__()
        self.mask = mask
        self.t = nn.Transformer(16, 2, 1, 1, 32, dropout=0.0, batch_first=True)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> Any:
        ones = torch.ones(tgt.shape[1], tgt.shape[1], dtype=torch.bool)
        mask = torch.triu(ones, 1) if self.mask == "causal" else torch.tril(ones, -1)
        return self.t(src, tgt, tgt_mask=mask)


@pytest.mark.parametrize(("mask", "verdict"), [("causal", "holds"), ("flipped", "leaks")])
def test_a_decoder_s_mask_orders_its_target_not_its_source(mask: str, verdict: str) -> None:
    torch.manual_seed(0)
    facts = probe(Seq2Seq(mask), (torch.randn(4, 9, 16), torch.randn(4, 6, 16)), {})
    assert [(f["what"], f["verdict"], f.get("module")) for f in facts] == [
        ("batch", "apart", None), ("causal", verdict, "t")]


def test_what_the_probe_cannot_decide() -> None:
    assert probe(nn.Linear(4, 2), ([torch.randn(3, 4)],), {}) == [
        {"what": "undecided", "why": "its first input is not a tensor"}]
    scalar = nn.Sequential(nn.Linear(4, 3), nn.Flatten(0))
    assert probe(scalar, (torch.randn(2, 4),), {})[0]["what"] == "undecided"


class KeptState(nn.Module):
    """A recurrent state kept on the module with its autograd history, and a lock: deepcopy
    refuses both, as it refused 3 of 4 attention and recurrent models of a blind set."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.GRU(4, 8, batch_first=True)
        self.state: torch.Tensor | None = None
        self.lock = threading.Lock()

    def forward(self, x: torch.Tensor) -> Any:
        out, self.state = self.rnn(x, None if self.state is None else self.state.detach() * 0)
        return out


def test_a_model_deepcopy_refuses_is_probed_all_the_same() -> None:
    torch.manual_seed(0)
    model = KeptState()
    model(torch.randn(2, 5, 4))  # its state now has a history
    with pytest.raises(RuntimeError):
        copy.deepcopy(model)
    facts = probe(model, (torch.randn(2, 5, 4),), {})
    assert facts[0]["what"] != "undecided", facts
    assert model.state is not None and model.state.grad_fn is not None  # left as it was


class Counted(nn.Module):
    """BatchNorm and dropout (their statistics and draws must stay the program's), a forward
    hook of the user's that counts calls (the copy must not run it)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(),
                                 nn.Dropout(0.3), nn.Linear(16, 4))
        self.calls = [0]
        counter = self.calls
        self.net.register_forward_hook(lambda *_: counter.__setitem__(0, counter[0] + 1))

    def forward(self, x: torch.Tensor) -> Any:
        return self.net(x)


def steps(model: Counted, traced: Path | None, probed: bool
          ) -> tuple[list[float], dict[str, torch.Tensor], list[torch.Tensor], torch.Tensor]:
    torch.manual_seed(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    with (hooktrace.trace(traced, model=model, probe=probed) if traced
          else contextlib.nullcontext()):
        for _ in range(3):
            opt.zero_grad()
            loss = F.cross_entropy(model(torch.randn(8, 8)), torch.randint(0, 4, (8,)))
            loss.backward()
            grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
            opt.step()
            losses.append(loss.item())
    state = {k: v.clone() for k, v in model.state_dict().items()}
    return losses, state, grads, torch.get_rng_state()


def test_a_probed_run_changes_nothing(tmp_path: Path) -> None:
    torch.manual_seed(1)
    model = Counted()
    start = {k: v.clone() for k, v in model.state_dict().items()}
    plain = steps(model, None, False)
    calls = model.calls[0]
    model.load_state_dict(start)
    log = tmp_path / "t.jsonl"
    probed = steps(model, log, True)
    assert model.calls[0] == 2 * calls  # the copy ran no hook of the user's
    assert probed[0] == plain[0]
    assert probed[1].keys() == plain[1].keys()
    assert all(torch.equal(probed[1][k], plain[1][k]) for k in plain[1])  # BN's stats too
    assert all(torch.equal(a, b) for a, b in zip(probed[2], plain[2], strict=True))
    assert torch.equal(probed[3], plain[3])
    records = read_log(log)
    assert isinstance(records[0], schema.Header) and records[0].options["probe"] is True
    signals = [r for r in records if isinstance(r, schema.Signal) and r.kind == "probe"]
    assert [(s.step, s.fqn, s.detail["what"], s.detail["verdict"]) for s in signals] == [
        (0, "net.1", "batch", "all")]  # once per model, at its first recorded call


def test_without_probe_nothing_is_probed(tmp_path: Path) -> None:
    log = tmp_path / "t.jsonl"
    steps(Counted(), log, False)
    records = read_log(log)
    assert "probe" not in records[0].options  # type: ignore[union-attr]
    assert not [r for r in records if isinstance(r, schema.Signal) and r.kind == "probe"]
