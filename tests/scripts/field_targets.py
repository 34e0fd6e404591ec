"""Field programs (issue 38): target networks, frozen copies and shared parameters, written as
the widely used training programs write them, one per CASE (argv[1]); healthy look-alikes
(``ok_``) must stay silent.

    python field_targets.py CASE [TRUTH]

With TRUTH, PyTorch's own answer is saved there as JSON (``groundtruth.GradTruth``): every
trainable module's ``.grad`` after each backward pass and at each optimizer step, and how far
the backbone's weights moved.

The bugs: a BYOL target made without ``copy.deepcopy`` (``byol_lazy_shared`` as
byol-pytorch's ``_get_target_encoder`` builds it, inside the first forward;
``byol_eager_shared`` in ``__init__``): the target *is* the online encoder, registered under a
second name, so freezing the target freezes the online network, which then runs with
gradients and under ``torch.no_grad()`` and never trains. And a freeze that happens inside the
first forward (``freeze_in_first_forward``: a head trained on a backbone its forward freezes at
its first call), which must keep its ``frozen`` note. And byol-pytorch's wrapper as it is
(``byol_hidden_layer``): the backbone runs in full and a hook takes its last layer but one, so
its last layer is unused by design; the backbone is registered on the learner too.
"""

from __future__ import annotations

import copy
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the ground truth
from groundtruth import GradTruth

STEPS = 6
TRUTH: GradTruth | None = None  # the census, where argv[2] asks for one


def images(n: int = 4, size: int = 8) -> torch.Tensor:
    return torch.randn(n, 3, size, size)


def backbone(out: int = 10) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, out))


def mlp(dim: int, out: int, hidden: int = 32) -> nn.Sequential:
    return nn.Sequential(nn.Linear(dim, hidden), nn.BatchNorm1d(hidden), nn.ReLU(),
                         nn.Linear(hidden, out))


def census(models: list[nn.Module]) -> None:
    """Start PyTorch's census of ``.grad`` for ``models`` (in the order the program first
    calls them) where a TRUTH file is asked for."""
    global TRUTH
    if len(sys.argv) > 2:
        TRUTH = GradTruth(models)
        TRUTH.watch_optimizers()


def passed() -> None:
    """A backward pass ended: the census reads every ``.grad``."""
    if TRUTH is not None:
        TRUTH.record()


def moved(module: nn.Module) -> Callable[[], float]:
    """How far ``module``'s weights will have moved: the largest change of any element."""
    before = [p.detach().clone() for p in module.parameters()]
    return lambda: max(float((p.detach() - b).abs().max()) for p, b in
                       zip(module.parameters(), before, strict=True))


# -- BYOL as byol-pytorch writes it ----------------------------------------------------------

def singleton(key: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """byol-pytorch's cache: the first call builds the attribute, later calls return it."""
    def inner(fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(self: nn.Module, *args: Any) -> Any:
            instance = getattr(self, key)
            if instance is None:
                instance = fn(self, *args)
                setattr(self, key, instance)  # an nn.Module: registered under that name
            return instance
        return wrapper
    return inner


def set_requires_grad(model: nn.Module, value: bool) -> None:
    for p in model.parameters():
        p.requires_grad = value


class NetWrapper(nn.Module):
    """The backbone and a projector: (projection, representation)."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net
        self.projector = mlp(10, 16)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        representation = self.net(x)
        return self.projector(representation), representation


def byol_loss(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return 2 - 2 * (F.normalize(x, dim=-1) * F.normalize(y, dim=-1)).sum(-1)


class BYOL(nn.Module):
    """Online encoder and predictor trained towards a target encoder run under no_grad.
    ``copy``: how the target is made from the online encoder (``copy.deepcopy``, or the bug:
    the online encoder itself); ``lazy``: at the first forward (byol-pytorch), else here."""

    def __init__(self, net: nn.Module, copy_fn: Callable[[nn.Module], nn.Module],
                 lazy: bool = True) -> None:
        super().__init__()
        self.copy_fn = copy_fn
        self.online_encoder = NetWrapper(net)
        self.online_predictor = mlp(16, 16)
        self.target_encoder: nn.Module | None = None
        if not lazy:
            self._get_target_encoder()

    @singleton("target_encoder")
    def _get_target_encoder(self) -> nn.Module:
        target = self.copy_fn(self.online_encoder)
        set_requires_grad(target, False)
        return target

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        views = torch.cat((x + 0.1 * torch.randn_like(x), x.flip(-1)))
        projections, _ = self.online_encoder(views)
        one, two = self.online_predictor(projections).chunk(2)
        with torch.no_grad():
            target = self._get_target_encoder()
            target_projections, _ = target(views)
            target_one, target_two = target_projections.detach().chunk(2)
        return (byol_loss(one, target_two) + byol_loss(two, target_one)).mean()

    def update_moving_average(self, decay: float = 0.99) -> None:
        assert self.target_encoder is not None
        with torch.no_grad():
            for t, o in zip(self.target_encoder.parameters(),
                            self.online_encoder.parameters(), strict=True):
                t.mul_(decay).add_(o, alpha=1 - decay)


class HiddenLayerWrapper(NetWrapper):
    """byol-pytorch's ``NetWrapper`` with ``hidden_layer=-2``: the representation is the output
    of the net's last layer but one, taken by a forward hook; the net's own result is thrown
    away (``_ = self.net(x)``), so its last layer never gets a gradient."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__(net)
        self.projector = mlp(8, 16)
        self.hidden: list[torch.Tensor] = []
        [*net.children()][-2].register_forward_hook(self._hook)  # a deepcopy hooks its copy

    def _hook(self, module: nn.Module, args: Any, output: torch.Tensor) -> None:
        self.hidden.append(output)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        _ = self.net(x)
        representation = self.hidden.pop()
        return self.projector(representation), representation


class HiddenLayerBYOL(BYOL):
    """byol-pytorch's ``BYOL``: the backbone registered on the learner (``self.net = net``)
    before the wrapper that calls it, the target a deepcopy at the first forward."""

    def __init__(self, net: nn.Module) -> None:
        nn.Module.__init__(self)
        self.net, self.copy_fn = net, copy.deepcopy
        self.online_encoder = HiddenLayerWrapper(net)
        self.online_predictor = mlp(16, 16)
        self.target_encoder = None


def train_byol(copy_fn: Callable[[nn.Module], nn.Module], lazy: bool,
               learner_of: Callable[[nn.Module], BYOL] | None = None) -> None:
    """byol-pytorch's README loop: Adam over learner.parameters(), the moving average after
    each step."""
    net = backbone()
    learner = learner_of(net) if learner_of else BYOL(net, copy_fn, lazy)
    census([learner])
    optimizer = torch.optim.Adam(learner.parameters(), lr=3e-4)
    distance = moved(net)
    for _ in range(STEPS):
        loss = learner(images())
        optimizer.zero_grad()
        loss.backward()
        passed()
        optimizer.step()
        learner.update_moving_average()
    print(f"backbone moved {distance():.3g}")


def same(module: nn.Module) -> nn.Module:
    return module


def byol_lazy_shared() -> None:
    """The bug: byol-pytorch's target built at the first forward without deepcopy
    (``target_encoder = self.online_encoder``): freezing it freezes the online encoder."""
    train_byol(same, lazy=True)


def byol_eager_shared() -> None:
    """The bug: the same target built in ``__init__``, so frozen before the first forward."""
    train_byol(same, lazy=False)


def ok_byol_lazy_deepcopy() -> None:
    """Healthy: byol-pytorch's own ``copy.deepcopy(self.online_encoder)`` at the first forward."""
    train_byol(copy.deepcopy, lazy=True)


def ok_byol_eager_deepcopy() -> None:
    """Healthy: the deepcopy made in ``__init__``."""
    train_byol(copy.deepcopy, lazy=False)


def byol_hidden_layer() -> None:
    """byol-pytorch as it is: its backbone's last layer unused by design, found in the
    wrapper's forward that throws its output away."""
    train_byol(copy.deepcopy, True, HiddenLayerBYOL)


# -- other look-alikes: frozen teachers, tied weights, siamese networks -----------------------

def ok_distill_frozen_teacher() -> None:
    """Healthy: a pretrained teacher, frozen, run under no_grad; the student learns from it."""
    teacher = backbone().eval()
    teacher.requires_grad_(False)
    student = backbone()
    census([teacher, student])  # in the order they are first called
    optimizer = torch.optim.SGD(student.parameters(), lr=0.1)
    for _ in range(STEPS):
        x = images()
        with torch.no_grad():
            soft = teacher(x).softmax(-1)
        loss = F.kl_div(student(x).log_softmax(-1), soft, reduction="batchmean")
        optimizer.zero_grad()
        loss.backward()
        passed()
        optimizer.step()


class TiedLM(nn.Module):
    """A language model whose output layer is its embedding (weight tying), both trained."""

    def __init__(self, vocab: int = 32, dim: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.rnn = nn.GRU(dim, dim, batch_first=True)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.rnn(self.embed(ids))
        out: torch.Tensor = self.lm_head(hidden)
        return out


def ok_tied_embedding() -> None:
    """Healthy: the embedding and output layer share one weight, trained."""
    model = TiedLM()
    census([model])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(STEPS):
        ids = torch.randint(0, 32, (4, 6))
        loss = F.cross_entropy(model(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        passed()
        optimizer.step()


class Siamese(nn.Module):
    """One encoder run on both inputs with gradients, and a head on their distance."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = backbone(16)
        self.head = nn.Linear(16, 1)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head((self.encoder(a) - self.encoder(b)).abs())
        return out


def ok_siamese() -> None:
    """Healthy: the same encoder twice in one step, both with gradients."""
    model = Siamese()
    census([model])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(STEPS):
        same_pair = torch.randint(0, 2, (4, 1)).float()
        loss = F.binary_cross_entropy_with_logits(model(images(), images()), same_pair)
        optimizer.zero_grad()
        loss.backward()
        passed()
        optimizer.step()


class Perceptual(nn.Module):
    """A generator trained through a frozen feature network: with gradients on its output,
    under no_grad on the real image (a perceptual loss)."""

    def __init__(self) -> None:
        super().__init__()
        self.generator = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(),
                                       nn.Conv2d(8, 3, 3, padding=1))
        self.features = backbone(16)
        self.features.requires_grad_(False)
        self.alias = self.features  # the same frozen network under a second name

    def forward(self, x: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        fake = self.generator(x)
        with torch.no_grad():
            want = self.alias(real)
        return F.mse_loss(self.features(fake), want)


def ok_perceptual_alias() -> None:
    """Healthy: a frozen feature network held under two names, run with gradients on the
    generator's output and under no_grad on the real image; no optimizer holds it."""
    model = Perceptual().eval()
    model.generator.train()
    census([model])
    optimizer = torch.optim.SGD(model.generator.parameters(), lr=0.1)
    for _ in range(STEPS):
        loss = model(images(), images())
        optimizer.zero_grad()
        loss.backward()
        passed()
        optimizer.step()


# -- a freeze inside the first forward -------------------------------------------------------

class LinearProbe(nn.Module):
    """A head trained on a backbone that its forward freezes at its first call, before
    calling it (a 'freeze the pretrained part' switch read in forward)."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = backbone(16)
        self.head = nn.Linear(16, 4)
        self.frozen = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.frozen:
            self.backbone.requires_grad_(False)
            self.frozen = True
        out: torch.Tensor = self.head(self.backbone(x))
        return out


def freeze_in_first_forward() -> None:
    """Not a bug: a frozen backbone, frozen inside step 0's forward; its frozen note stays."""
    model = LinearProbe()
    census([model])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(STEPS):
        loss = F.cross_entropy(model(images()), torch.randint(0, 4, (4,)))
        optimizer.zero_grad()
        loss.backward()
        passed()
        optimizer.step()


BUGS: tuple[Callable[[], None], ...] = (byol_lazy_shared, byol_eager_shared, byol_hidden_layer)
HEALTHY: tuple[Callable[[], None], ...] = (
    ok_byol_lazy_deepcopy, ok_byol_eager_deepcopy,
    ok_distill_frozen_teacher, ok_tied_embedding, ok_siamese, ok_perceptual_alias,
    freeze_in_first_forward,
)
CASES = {f.__name__: f for f in BUGS + HEALTHY}

if __name__ == "__main__":
    torch.manual_seed(0)
    CASES[sys.argv[1]]()
    if TRUTH is not None:
        TRUTH.save(sys.argv[2])
    print(json.dumps({"case": sys.argv[1], "done": True}))
