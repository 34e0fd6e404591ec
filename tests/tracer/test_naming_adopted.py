"""A module called on its own before the model that holds it is first called: from then on its
whole tree is named as part of that model.

torchvision's SSDlite calls its backbone at construction, under ``torch.no_grad()``, to size its
feature maps: traced from the start (``hooktrace run``), the backbone was a model of its own, and
when the detector was first called only the backbone's root joined it; its children stayed in the
backbone's model, whose exactly-zero gradients ``check`` could not explain. Models that are truly
apart (a GAN's two networks, a teacher called outside its student, a loss module) stay apart.
Every run is a real traced run; ``check`` is the real command.
"""

from __future__ import annotations

from pathlib import Path

import torch
from helpers import events, read_log
from torch import nn
from torch.nn import functional as F

import hooktrace
from hooktrace.log import schema
from tracer.test_naming import check_findings, models_and_modules


def out_channels(model: nn.Module) -> int:
    """As torchvision's ``retrieve_out_channels``: one call at construction, no gradient."""
    with torch.no_grad():
        return int(model(torch.zeros(1, 8)).shape[-1])


class Backbone(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.features(x)  # type: ignore[no-any-return]


class Detector(nn.Module):
    def __init__(self, detach: bool = False) -> None:
        super().__init__()
        backbone = Backbone()
        self.head = nn.Linear(out_channels(backbone), 3)
        self.backbone = backbone
        self.detach = detach  # the bug: the backbone's features detached from the loss

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = self.backbone(x)
        return self.head(features.detach() if self.detach else features)  # type: ignore[no-any-return]


def train_detector(path: Path, steps: int, detach: bool = False) -> None:
    """The detector built inside the traced run, then trained: as ``hooktrace run`` sees it."""
    torch.manual_seed(0)
    x, target = torch.randn(4, 8), torch.tensor([0, 1, 2, 1])
    with hooktrace.trace(path):
        detector = Detector(detach)
        optimizer = torch.optim.SGD(detector.parameters(), lr=0.1)
        for _ in range(steps):
            optimizer.zero_grad()
            F.cross_entropy(detector(x), target).backward()
            optimizer.step()


DETECTOR_MODULES = [(1, ""), (1, "head"), (1, "backbone"), (1, "backbone.features"),
                    (1, "backbone.features.0"), (1, "backbone.features.1"),
                    (1, "backbone.features.2")]
DETECTOR_CALLS = [(1, "backbone.features.0"), (1, "backbone.features.1"),
                  (1, "backbone.features.2"), (1, "backbone.features"), (1, "backbone"),
                  (1, "head"), (1, "")]


def test_a_module_called_at_construction_is_named_in_the_model_that_holds_it(
        log_path: Path) -> None:
    train_detector(log_path, 2)
    models, modules = models_and_modules(log_path)
    assert models == [(0, "model", "Backbone"), (1, "detector", "Detector")]
    assert [m for m in modules if m[0] == 1] == DETECTOR_MODULES
    forward = [(e.model, e.fqn, e.no_grad) for e in events(log_path, "forward", 0)]
    # the construction call: the backbone's model of its own, under no_grad; then the detector
    assert forward[:5] == [(0, "features.0", True), (0, "features.1", True),
                           (0, "features.2", True), (0, "features", True), (0, "", True)]
    assert [(m, n) for m, n, _ in forward[5:]] == DETECTOR_CALLS
    assert [(e.model, e.fqn) for e in events(log_path, "forward", 1)] == DETECTOR_CALLS
    assert [(e.model, e.fqn) for e in events(log_path, "backward", 1)] == DETECTOR_CALLS[::-1]
    # the parameters' gradients are the detector's, in each step: none said of the backbone's
    # model, which took no part in a backward pass
    assert {(r.step, r.model) for r in read_log(log_path)
            if isinstance(r, schema.ParamGrads)} == {(0, 1), (1, 1)}
    assert check_findings(log_path) == []


def test_a_bug_in_a_module_called_at_construction_is_named_in_its_model(log_path: Path
                                                                       ) -> None:
    train_detector(log_path, 2, detach=True)
    found = check_findings(log_path)
    assert ("no-grad", "warning", "detector", "") in found, found
    assert all(model == "detector" for _, _, model, _ in found), found


def test_a_model_trained_alone_then_inside_another_joins_it(log_path: Path) -> None:
    """An encoder trained on its own first, then fine-tuned inside a classifier: its calls
    inside the classifier are the classifier's, as they are when the classifier runs first."""
    torch.manual_seed(0)
    x = torch.randn(4, 8)
    with hooktrace.trace(log_path):
        encoder = nn.Sequential(nn.Linear(8, 8), nn.Tanh())
        encoder(x).pow(2).mean().backward()  # step 0: the encoder alone
        classifier = nn.Sequential(encoder, nn.Linear(8, 3))
        for _ in range(2):
            classifier(x).logsumexp(-1).mean().backward()
    models, modules = models_and_modules(log_path)
    assert models == [(0, "encoder", "Sequential"), (1, "classifier", "Sequential")]
    assert [m for m in modules if m[0] == 1] == [(1, ""), (1, "0"), (1, "0.0"), (1, "0.1"),
                                                 (1, "1")]
    assert [(e.model, e.fqn) for e in events(log_path, "forward", 0)] == [
        (0, "0"), (0, "1"), (0, "")]
    for step in (1, 2):
        assert [(e.model, e.fqn) for e in events(log_path, "forward", step)] == [
            (1, "0.0"), (1, "0.1"), (1, "0"), (1, "1"), (1, "")]
    assert [f for f in check_findings(log_path) if f[1] != "note"] == []


class Generator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 6))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.net(z)  # type: ignore[no-any-return]


def test_models_apart_stay_apart(log_path: Path) -> None:
    """A GAN's generator first called under no_grad (a fixed sample), then its discriminator;
    a frozen teacher called outside its student; a loss module: each its own model, with all
    its modules, in every step."""
    torch.manual_seed(0)
    z, x = torch.randn(4, 4), torch.randn(4, 6)
    with hooktrace.trace(log_path):
        netG, netD = Generator(), nn.Sequential(nn.Linear(6, 8), nn.LeakyReLU(), nn.Linear(8, 1))
        teacher, student = nn.Sequential(nn.Linear(6, 3)), nn.Sequential(nn.Linear(6, 3))
        teacher.requires_grad_(False)
        criterion = nn.MSELoss()
        with torch.no_grad():
            netG(z)  # a fixed sample to watch, before training
        opt_g, opt_d = (torch.optim.SGD(m.parameters(), lr=0.01) for m in (netG, netD))
        opt_s = torch.optim.SGD(student.parameters(), lr=0.01)
        for _ in range(2):
            opt_d.zero_grad()
            d_loss = F.softplus(-netD(x)).mean() + F.softplus(netD(netG(z).detach())).mean()
            d_loss.backward()
            opt_d.step()
            opt_g.zero_grad()
            F.softplus(-netD(netG(z))).mean().backward()
            opt_g.step()
            opt_s.zero_grad()
            with torch.no_grad():
                soft = teacher(x)
            criterion(student(x), soft).backward()
            opt_s.step()
    models, modules = models_and_modules(log_path)
    assert models == [(0, "netG", "Generator"), (1, "netD", "Sequential"),
                      (2, "teacher", "Sequential"), (3, "student", "Sequential"),
                      (4, "criterion", "MSELoss")]
    assert [m for m in modules if m[0] == 0] == [(0, ""), (0, "net"), (0, "net.0"),
                                                 (0, "net.1"), (0, "net.2")]
    assert {e.model for e in events(log_path, "forward") if e.fqn == "net.0"} == {0}
    assert [f for f in check_findings(log_path) if f[1] != "note"] == []


def test_models_given_stay_as_given(log_path: Path) -> None:
    """``model=[backbone, detector]``: the models asked for are kept as they are; the backbone's
    calls inside the detector are its own model's (its root too: it was the detector's)."""
    torch.manual_seed(0)
    detector = Detector()
    x, target = torch.randn(4, 8), torch.tensor([0, 1, 2, 1])
    with hooktrace.trace(log_path, model=[detector.backbone, detector]):
        F.cross_entropy(detector(x), target).backward()
    assert [(e.model, e.fqn) for e in events(log_path, "forward")] == [
        (0, "features.0"), (0, "features.1"), (0, "features.2"), (0, "features"), (0, ""),
        (1, "head"), (1, "")]
