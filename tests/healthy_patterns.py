"""Healthy training patterns that look like gradient bugs to a naive checker, each as a
``groundtruth.Case``: reversible layers, linear probing, data transforms, a loss scaler that
skips an overflowed step, an EMA teacher, SimSiam and BYOL stop-gradient, and activation
checkpointing both ways. Small models: each case is about its pattern, not its size."""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
import torchvision
from groundtruth import Case, sgd
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint


def _mlp(dim: int) -> nn.Sequential:
    return nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, dim), nn.GELU())


def _images(n: int = 2, size: int = 64) -> torch.Tensor:
    return torch.randn(n, 3, size, size)


class RevBlock(nn.Module):
    """A reversible residual block (RevNet, Reformer): y1 = x1 + f(x2), y2 = x2 + g(y1); its
    inputs are computed back from its outputs in backward, so no activation is stored."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.f, self.g = _mlp(dim), _mlp(dim)

    def forward(self, x1: torch.Tensor, x2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y1 = x1 + self.f(x2)
        return y1, x2 + self.g(y1)

    def backward_pass(self, y1: torch.Tensor, y2: torch.Tensor, dy1: torch.Tensor,
                      dy2: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Recompute g then f with gradients on: their weights get their gradients here."""
        with torch.enable_grad():
            y1 = y1.detach().requires_grad_()
            gy1 = self.g(y1)
            torch.autograd.backward(gy1, dy2)
        with torch.no_grad():
            x2 = y2 - gy1
            dx1 = dy1 + y1.grad
        with torch.enable_grad():
            x2 = x2.detach().requires_grad_()
            fx2 = self.f(x2)
            torch.autograd.backward(fx2, dx1)
        with torch.no_grad():
            return y1 - fx2, x2, dx1, dy2 + x2.grad


class _Reversible(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x1, x2, blocks):  # type: ignore[no-untyped-def, override]
        with torch.no_grad():  # what makes it reversible: nothing is kept for backward
            for block in blocks:
                x1, x2 = block(x1, x2)
        ctx.blocks = blocks
        ctx.save_for_backward(x1, x2)
        return x1, x2

    @staticmethod
    def backward(ctx, dy1, dy2):  # type: ignore[no-untyped-def, override]
        y1, y2 = ctx.saved_tensors
        for block in reversed(ctx.blocks):
            y1, y2, dy1, dy2 = block.backward_pass(y1, y2, dy1, dy2)
        return dy1, dy2, None


class RevNet(nn.Module):
    def __init__(self, dim: int = 32, depth: int = 4, classes: int = 10) -> None:
        super().__init__()
        self.embed = nn.Linear(16, 2 * dim)
        self.blocks = nn.ModuleList(RevBlock(dim) for _ in range(depth))
        self.head = nn.Linear(2 * dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x1, x2 = self.embed(x).chunk(2, dim=-1)
        x1, x2 = _Reversible.apply(x1, x2, self.blocks)
        return self.head(torch.cat([x1, x2], dim=-1))


def _classify(model: nn.Module, x: Callable[[], torch.Tensor], classes: int = 10
              ) -> Callable[[], None]:
    def backward() -> None:
        batch = x()
        F.cross_entropy(model(batch), torch.randint(0, classes, (batch.shape[0],))).backward()
    return backward


def reversible() -> Case:
    model = RevNet().train()
    return Case([model], _classify(model, lambda: torch.randn(2, 16)), sgd([model]))


def linear_probe() -> Case:
    """A frozen (pretrained) backbone, a new trainable head, eval mode on purpose: the frozen
    BatchNorm statistics stay as loaded."""
    model = torchvision.models.resnet18(weights=None)
    model.requires_grad_(False)
    model.fc = nn.Linear(model.fc.in_features, 10)
    model.eval()
    return Case([model], _classify(model, _images), sgd([model.fc]))


def transforms() -> Case:
    """Augmentations are nn.Modules: applied to each image of the batch, as a Dataset does,
    outside any model, on tensors that need no gradient."""
    from torchvision.transforms import v2

    augment = v2.Compose([v2.Resize(72, antialias=True),
                          v2.RandomResizedCrop(64, antialias=True),
                          v2.RandomHorizontalFlip()])
    model = torchvision.models.resnet18(weights=None, num_classes=10).train()

    def batch() -> torch.Tensor:
        return torch.stack([augment(torch.rand(3, 80, 96)) for _ in range(2)])

    return Case([model], _classify(model, batch), sgd([model]), scoped=False)


def grad_scaler() -> Case:
    """Mixed precision with torch.amp.GradScaler: float16 autocast, a first scale too large
    (the float16 gradients overflow), so the scaler skips that step and lowers the scale to
    its usual start (2**16); the following steps train."""
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(8, 10)).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**20, backoff_factor=2.0**-4)

    def backward() -> None:
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.cross_entropy(model(_images(size=16)), torch.randint(0, 10, (2,)))
        scaler.scale(loss).backward()

    def update() -> None:
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)

    return Case([model], backward, update)


def sigmoid_bce() -> Case:
    """A sigmoid at the output and ``BCELoss`` (pytorch/examples' siamese network): some
    predictions confidently wrong (the last bias at 15), so the loss's gradient, which divides
    by p (1 - p), explodes at the sigmoid, whose tiny gain cancels it: the logits get the
    usual ``p - y``."""
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 1), nn.Sigmoid()).train()
    with torch.no_grad():
        model[2].weight.mul_(0.01)
        model[2].bias.fill_(15.0)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)

    def backward() -> None:
        target = torch.tensor([[1.0], [0.0]] * 4)
        F.binary_cross_entropy(model(torch.randn(8, 16)), target).backward()

    def update() -> None:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return Case([model], backward, update)


def _small_cnn(out: int = 16) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                         nn.Conv2d(16, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16),
                         nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, out))


def _ema(teacher: nn.Module, student: nn.Module, decay: float = 0.99) -> None:
    with torch.no_grad():
        for t, s in zip(teacher.parameters(), student.parameters(), strict=True):
            t.mul_(decay).add_(s, alpha=1 - decay)
        for t, s in zip(teacher.buffers(), student.buffers(), strict=True):
            t.copy_(s)


def ema_teacher() -> Case:
    """Mean teacher: the teacher is an EMA of the student, run under no_grad, never trained;
    the student learns from labels and from agreeing with it."""
    student = _small_cnn(10).train()
    teacher = copy.deepcopy(student).requires_grad_(False)
    step = sgd([student])

    def backward() -> None:
        x, noisy = _images(size=16), _images(size=16)
        with torch.no_grad():
            target = teacher(noisy).softmax(-1)
        logits = student(x)
        loss = F.cross_entropy(logits, torch.randint(0, 10, (2,)))
        (loss + F.mse_loss(logits.softmax(-1), target)).backward()

    def update() -> None:
        step()
        _ema(teacher, student)

    return Case([student, teacher], backward, update)


def _negative_cosine(p: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    return -F.cosine_similarity(p, z.detach(), dim=-1).mean()  # the stop-gradient


def simsiam() -> Case:
    """SimSiam: two views through one encoder; each view's predictor output is pulled towards
    the other's embedding, detached."""
    encoder = _small_cnn(32).train()
    predictor = nn.Sequential(nn.Linear(32, 16), nn.BatchNorm1d(16), nn.ReLU(),
                              nn.Linear(16, 32)).train()

    def backward() -> None:
        x = _images(size=16)
        z1, z2 = encoder(x + 0.1 * torch.randn_like(x)), encoder(x.flip(-1))
        loss = _negative_cosine(predictor(z1), z2) / 2 + _negative_cosine(predictor(z2), z1) / 2
        loss.backward()

    return Case([encoder, predictor], backward, sgd([encoder, predictor]))


def byol() -> Case:
    """BYOL: an online encoder and predictor trained towards a target encoder, an EMA of the
    online one run under no_grad."""
    online = _small_cnn(32).train()
    predictor = nn.Sequential(nn.Linear(32, 16), nn.BatchNorm1d(16), nn.ReLU(),
                              nn.Linear(16, 32)).train()
    target = copy.deepcopy(online).requires_grad_(False)
    step = sgd([online, predictor])

    def backward() -> None:
        x = _images(size=16)
        v1, v2 = x + 0.1 * torch.randn_like(x), x.flip(-1)
        with torch.no_grad():
            t1, t2 = target(v1), target(v2)
        p1, p2 = predictor(online(v1)), predictor(online(v2))
        (_negative_cosine(p1, t2) + _negative_cosine(p2, t1)).backward()

    def update() -> None:
        step()
        _ema(target, online)

    return Case([online, predictor, target], backward, update)


class Checkpointed(nn.Module):
    """Transformer-like blocks each run through torch.utils.checkpoint: activations are
    recomputed in backward."""

    def __init__(self, reentrant: bool, dim: int = 32, depth: int = 3) -> None:
        super().__init__()
        self.reentrant = reentrant
        self.embed = nn.Linear(16, dim)  # before the first checkpoint: its input needs a grad
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, 2 * dim),
                                                  nn.GELU(), nn.Dropout(0.1),
                                                  nn.Linear(2 * dim, dim))
                                    for _ in range(depth))
        self.head = nn.Linear(dim, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = x + checkpoint(block, x, use_reentrant=self.reentrant)
        return self.head(x)


def checkpointing(reentrant: bool) -> Callable[[], Case]:
    def case() -> Case:
        model = Checkpointed(reentrant).train()
        return Case([model], _classify(model, lambda: torch.randn(2, 16)), sgd([model]))
    return case


PATTERNS: dict[str, Callable[[], Case]] = {
    "reversible": reversible,
    "linear_probe": linear_probe,
    "transforms": transforms,
    "grad_scaler": grad_scaler,
    "sigmoid_bce": sigmoid_bce,
    "ema_teacher": ema_teacher,
    "simsiam": simsiam,
    "byol": byol,
    "checkpoint_reentrant": checkpointing(True),
    "checkpoint_non_reentrant": checkpointing(False),
}

