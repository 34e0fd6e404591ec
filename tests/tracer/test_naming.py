"""Models called through a method other than ``forward`` are named from the module that owns them.

A VAE's ``encode``/``decode``, a CLIP-like model's ``encode_image``/``encode_text``: the model
is the outermost ``self`` of the calling frames whose tree holds the called module, its fqns the
owner's ``named_modules()`` names. Without such an owner, naming stays as it was. Every run is a
real traced run; ``check`` is the real command.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import FrameType
from typing import Any

import torch
from helpers import events, hooktrace_cmd, read_log
from torch import nn

import hooktrace
from hooktrace.hooks import owners
from hooktrace.log import schema


class VAE(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(8, 4), nn.Tanh())
        self.decoder = nn.Sequential(nn.Linear(4, 8))

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x)  # type: ignore[no-any-return]

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        return self.decoder(z)  # type: ignore[no-any-return]


class TwoTower(nn.Module):
    """CLIP's shape: two towers called through their own methods, a scale used directly."""

    def __init__(self) -> None:
        super().__init__()
        self.visual = nn.Sequential(nn.Linear(6, 4), nn.ReLU(), nn.Linear(4, 3))
        self.text = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 3))
        self.logit_scale = nn.Parameter(torch.tensor(2.0))

    def encode_image(self, image: torch.Tensor) -> torch.Tensor:
        return self.visual(image)  # type: ignore[no-any-return]

    def encode_text(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.text(tokens).mean(1)  # type: ignore[no-any-return]


class Diffusion(nn.Module):
    """Owns a VAE and calls it through ``vae.encode`` from a method of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.vae = VAE()
        self.denoiser = nn.Linear(4, 4)

    def training_loss(self, x: torch.Tensor) -> torch.Tensor:
        z = self.vae.encode(x)
        return (self.denoiser(z) - z).pow(2).mean()


def models_and_modules(path: Path) -> tuple[list[tuple[int, str, str]], list[tuple[int, str]]]:
    records = read_log(path)
    return ([(r.model, r.name, r.cls) for r in records if isinstance(r, schema.Model)],
            [(r.model, r.fqn) for r in records if isinstance(r, schema.Module)])


def order(path: Path, phase: str, step: int = 0) -> list[tuple[int, str, int]]:
    return [(e.model, e.fqn, e.call) for e in events(path, phase, step)]


def check_findings(path: Path) -> list[tuple[str, str, str, str]]:
    """``hooktrace check --json``'s findings: (kind, severity, model, module)."""
    done = hooktrace_cmd("check", "--json", path)
    assert done.returncode in (0, 1), done.stderr
    return [(f["cause"], f["severity"], f["model"], f["module"])
            for f in json.loads(done.stdout)["findings"]]


def vae_steps(path: Path, steps: int) -> None:
    torch.manual_seed(0)
    vae = VAE()
    x = torch.randn(2, 8)
    with hooktrace.trace(path):
        for _ in range(steps):
            (vae.decode(vae.encode(x)) - x).pow(2).mean().backward()


def test_vae_encode_decode_one_model_named_from_its_owner(log_path: Path) -> None:
    vae_steps(log_path, 2)
    assert models_and_modules(log_path) == (
        [(0, "vae", "VAE")],
        [(0, ""), (0, "encoder"), (0, "encoder.0"), (0, "encoder.1"), (0, "decoder"),
         (0, "decoder.0")])
    for step in (0, 1):
        assert order(log_path, "forward", step) == [
            (0, "encoder.0", 0), (0, "encoder.1", 0), (0, "encoder", 0),
            (0, "decoder.0", 0), (0, "decoder", 0)]
        assert order(log_path, "backward", step) == [
            (0, "decoder", 0), (0, "decoder.0", 0),
            (0, "encoder", 0), (0, "encoder.1", 0), (0, "encoder.0", 0)]


def test_vae_root_never_called_is_not_unused(log_path: Path) -> None:
    vae_steps(log_path, 1)
    assert check_findings(log_path) == []


def test_two_towers_through_encode_methods(log_path: Path) -> None:
    torch.manual_seed(0)
    clip = TwoTower()
    with hooktrace.trace(log_path):
        image = clip.encode_image(torch.randn(2, 6))
        text = clip.encode_text(torch.randint(0, 10, (2, 5)))
        (clip.logit_scale.exp() * image @ text.t()).logsumexp(1).mean().backward()
    assert models_and_modules(log_path) == (
        [(0, "clip", "TwoTower")],
        [(0, ""), (0, "visual"), (0, "visual.0"), (0, "visual.1"), (0, "visual.2"),
         (0, "text"), (0, "text.0"), (0, "text.1")])
    assert order(log_path, "forward") == [
        (0, "visual.0", 0), (0, "visual.1", 0), (0, "visual.2", 0), (0, "visual", 0),
        (0, "text.0", 0), (0, "text.1", 0), (0, "text", 0)]
    # the root is never called, but its logit_scale got a gradient: it is not unused
    assert check_findings(log_path) == []


def test_outermost_owner_names_a_nested_owner_s_modules(log_path: Path) -> None:
    torch.manual_seed(0)
    diffusion = Diffusion()
    with hooktrace.trace(log_path):
        diffusion.training_loss(torch.randn(2, 8)).backward()
    assert models_and_modules(log_path) == (
        [(0, "diffusion", "Diffusion")],
        [(0, ""), (0, "vae"), (0, "vae.encoder"), (0, "vae.encoder.0"), (0, "vae.encoder.1"),
         (0, "vae.decoder"), (0, "vae.decoder.0"), (0, "denoiser")])
    assert order(log_path, "forward") == [
        (0, "vae.encoder.0", 0), (0, "vae.encoder.1", 0), (0, "vae.encoder", 0),
        (0, "denoiser", 0)]


def test_module_added_to_a_named_owner_joins_its_model(log_path: Path) -> None:
    class Growing(VAE):
        def refine(self, x: torch.Tensor) -> torch.Tensor:
            return self.extra(self.encode(x))  # type: ignore[no-any-return]

    torch.manual_seed(0)
    vae = Growing()
    x = torch.randn(2, 8)
    with hooktrace.trace(log_path):
        vae.encode(x).sum().backward()
        vae.extra = nn.Linear(4, 4)  # registered after the model was named
        vae.refine(x).sum().backward()
    assert models_and_modules(log_path) == (
        [(0, "vae", "Growing")],
        [(0, ""), (0, "encoder"), (0, "encoder.0"), (0, "encoder.1"), (0, "decoder"),
         (0, "decoder.0"), (0, "extra")])
    assert order(log_path, "forward", 1) == [
        (0, "encoder.0", 0), (0, "encoder.1", 0), (0, "encoder", 0), (0, "extra", 0)]


def test_without_an_owner_naming_stays(log_path: Path) -> None:
    """A bare Sequential in a script, and a module a method builds on the spot (no tree holds
    it): each is a model of its own, as before."""
    torch.manual_seed(0)
    head = nn.Sequential(nn.Linear(4, 2))

    class Scaled(VAE):
        def encode(self, x: torch.Tensor) -> torch.Tensor:
            return nn.Softsign()(self.encoder(x))  # type: ignore[no-any-return]

    scaled = Scaled()
    with hooktrace.trace(log_path):
        head(scaled.encode(torch.randn(2, 8))).sum().backward()
    assert models_and_modules(log_path)[0] == [
        (0, "scaled", "Scaled"), (1, "Softsign", "Softsign"), (2, "head", "Sequential")]
    assert order(log_path, "forward") == [
        (0, "encoder.0", 0), (0, "encoder.1", 0), (0, "encoder", 0), (1, "", 0), (2, "0", 0),
        (2, "", 0)]


class LM(nn.Module):
    """A language model whose embedding the loop calls through ``get_input_embeddings()``."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 10)

    def get_input_embeddings(self) -> nn.Module:
        return self.emb

    def forward(self, inputs_embeds: torch.Tensor) -> torch.Tensor:
        return self.head(inputs_embeds)  # type: ignore[no-any-return]


def test_a_module_reached_through_an_expression_is_named_from_its_holder(log_path: Path
                                                                          ) -> None:
    """No ``self`` owns the call, and the code has no variable for the module itself: the
    model is what the code's variables hold (a model's ``get_input_embeddings()``, a helper
    given the VAE, a plain class's ``self.pipeline.model``), from the first step on."""
    torch.manual_seed(0)
    lm, vae = LM(), VAE()

    def reconstruct(m: VAE, x: torch.Tensor) -> torch.Tensor:
        return m.decoder(m.encoder(x))  # type: ignore[no-any-return]

    class Pipeline:  # not a module: its attribute holds the model
        def __init__(self) -> None:
            self.model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2))

        def loss(self, x: torch.Tensor) -> torch.Tensor:
            return self.model[1](self.model[0](x)).sum()  # type: ignore[no-any-return]

    pipe = Pipeline()
    ids, x = torch.randint(0, 10, (2, 5)), torch.randn(2, 8)
    with hooktrace.trace(log_path):
        for _ in range(2):
            loss = lm(inputs_embeds=lm.get_input_embeddings()(ids)).logsumexp(-1).mean()
            loss = loss + (reconstruct(vae, x) - x).pow(2).mean() + pipe.loss(x)
            loss.backward()
    assert models_and_modules(log_path)[0] == [
        (0, "lm", "LM"), (1, "m", "VAE"), (2, "self.model", "Sequential")]
    for step in (0, 1):
        assert order(log_path, "forward", step) == [
            (0, "emb", 0), (0, "head", 0), (0, "", 0),
            (1, "encoder.0", 0), (1, "encoder.1", 0), (1, "encoder", 0),
            (1, "decoder.0", 0), (1, "decoder", 0), (2, "0", 0), (2, "1", 0)]
    assert check_findings(log_path) == []


def test_owner_found_once_per_model_not_per_call(log_path: Path) -> None:
    """The frames are walked at first sight only: once for three steps of the VAE."""
    calls = {owners.owner_of.__code__: 0, owners.variable_name.__code__: 0}

    def count(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code in calls:
            calls[frame.f_code] += 1

    sys.setprofile(count)
    try:
        vae_steps(log_path, 3)
    finally:
        sys.setprofile(None)
    assert list(calls.values()) == [1, 1]
    assert len(events(log_path, "forward")) == 15


def test_spectral_norm_built_while_tracing_stays_in_its_model(log_path: Path) -> None:
    """``spectral_norm`` evaluates its parametrization when it registers it, on a layer not yet
    in any model: that call makes no model of its own; the model that calls the layer names
    the parametrization under it, and check finds nothing (it said 'ran forward but no gradient
    reached it' of a model 'ParametrizationList' before)."""
    from torch.nn.utils.parametrizations import spectral_norm

    torch.manual_seed(0)
    with hooktrace.trace(log_path):
        critic = nn.Sequential(spectral_norm(nn.Linear(8, 16)), nn.LeakyReLU(0.2),
                               spectral_norm(nn.Linear(16, 1)))
        optimizer = torch.optim.Adam(critic.parameters(), lr=1e-3)
        for _ in range(3):
            optimizer.zero_grad()
            nn.functional.softplus(-critic(torch.randn(8, 8))).mean().backward()
            optimizer.step()
    models, modules = models_and_modules(log_path)
    assert models == [(0, "critic", "Sequential")]
    assert (0, "0.parametrizations.weight.0") in modules
    assert "0.parametrizations.weight.0" in [e.fqn for e in events(log_path, "forward", 0)]
    assert [f for f in check_findings(log_path) if f[1] != "note"] == []
