"""Field programs for issue 38 (evaluation passes; notes that flood or mislead): training
programs shaped as widely used ones are, one per CASE (argv[1]); the healthy ones (``HEALTHY``)
must stay silent, the bugs (``BUGS``) found.

    python field_eval.py CASE

* ``timm_validate``: timm's ``train.py`` in small: a resnet18 inside a wrapper, trained with
  SGD and an EMA copy of it (``timm.utils.ModelEmaV3``); when an epoch ends within the recorded
  steps, the inner model and the EMA copy are validated under ``torch.inference_mode()`` in
  eval mode, then training goes on;
* ``lora_32``: a 32-layer transformer-like model, every base weight frozen, LoRA adapters
  (``lora_A``, ``lora_B`` zero at start) on its attention's query and value, written with
  plain torch as peft builds it;
* ``byol_target``: BYOL: an online network with BatchNorm and a target network made by
  ``deepcopy`` of it, frozen, run under ``no_grad`` in train mode (as byol-pytorch does), and
  moved towards the online one by an EMA after each optimizer step;
* ``timm_validate_grad``: the same, validated with gradients on, in eval mode only (no
  ``no_grad`` or ``inference_mode``: the validation's outputs are never backpropagated);
* ``eval_finetune``: a sequence model fine-tuned in eval mode on purpose (its BatchNorm frozen,
  ``model.eval()`` at every step to keep its running statistics): training, not evaluation;
* ``bug_train_no_grad`` (the look-alike that is a bug): the same wrapped resnet18, its training
  forward run under ``torch.no_grad()`` by mistake except for the classifier; the backbone's
  weights never get a gradient though the optimizer holds them;
* ``bug_eval_reset`` (a bug that looks like an evaluation pass): ``eval_finetune`` with its
  recurrent state re-initialised inside the time loop: the cell's calls before the last, in
  eval mode with no backward, are results thrown away, not a validation pass.

Every case trains on random data for a few steps on the CPU.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

STEPS = 8
EPOCH = 3  # steps per epoch: epochs end at steps 2 and 5, within the recorded steps (0:10)


def images(n: int = 4, size: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(n, 3, size, size), torch.randint(0, 10, (n,))


class Wrapper(nn.Module):
    """What a training framework puts around the model (DDP, a task wrapper): its forward
    calls the model, validation calls the model inside it."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.model(x)
        return out


def resnet18() -> nn.Module:
    import timm

    model: nn.Module = timm.create_model("resnet18", pretrained=False, num_classes=10)
    return model


def validate(model: nn.Module, inference: bool = True) -> float:
    """timm's ``validate``: eval mode, inference_mode, a few batches, the top-1 accuracy;
    ``inference``: False, in eval mode only, with gradients on."""
    model.eval()
    correct = 0
    with torch.inference_mode(inference):
        for _ in range(2):
            x, y = images()
            correct += int((model(x).argmax(-1) == y).sum())
    return correct / 8


def timm_validate(inference: bool = True) -> None:
    from timm.utils import ModelEmaV3

    wrapper = Wrapper(resnet18())
    ema = ModelEmaV3(wrapper.model, decay=0.9)
    opt = torch.optim.SGD(wrapper.parameters(), lr=0.01, momentum=0.9)
    for step in range(STEPS):
        wrapper.train()
        x, y = images()
        loss = F.cross_entropy(wrapper(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        ema.update(wrapper.model, step=step)
        print(f"step {step}: loss {loss.item():.4f}")
        if step % EPOCH == EPOCH - 1:  # the epoch ends
            print(f"  top-1 {validate(wrapper.model, inference):.2f}, "
                  f"ema {validate(ema, inference):.2f}")


def timm_validate_grad() -> None:
    timm_validate(inference=False)


class NormedRNN(nn.Module):
    """A frozen BatchNorm over the inputs (its statistics from pretraining), then an Elman RNN
    over the time steps; ``reset_inside``: the state re-initialised inside the time loop."""

    def __init__(self, reset_inside: bool = False) -> None:
        super().__init__()
        self.norm = nn.BatchNorm1d(8).requires_grad_(False)
        self.ih = nn.Linear(8, 16)
        self.hh = nn.Linear(16, 16)
        self.head = nn.Linear(16, 3)
        self.reset_inside = reset_inside

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(x.transpose(1, 2)).transpose(1, 2)
        h = x.new_zeros(x.shape[0], 16)
        for t in range(x.shape[1]):
            if self.reset_inside:
                h = x.new_zeros(x.shape[0], 16)  # the bug: the state starts again at each step
            h = torch.tanh(self.ih(x[:, t]) + self.hh(h))
        out: torch.Tensor = self.head(h)
        return out


def eval_finetune(reset_inside: bool = False) -> None:
    model = NormedRNN(reset_inside)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    for step in range(STEPS):
        model.eval()  # on purpose: the frozen BatchNorm keeps its running statistics
        loss = F.cross_entropy(model(torch.randn(8, 5, 8)), torch.randint(0, 3, (8,)))
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"step {step}: loss {loss.item():.4f}")


def bug_eval_reset() -> None:
    eval_finetune(reset_inside=True)


class Task(nn.Module):
    """timm's ``ClassificationTask`` (train.py since timm 1.1): the model, its loss, and the
    EMA copy (``ModelEmaV3``, whose parameters keep ``requires_grad=True``) in one module; the
    optimizer holds the model's parameters, validation calls the EMA copy on its own."""

    def __init__(self, model: nn.Module) -> None:
        from timm.utils import ModelEmaV3

        super().__init__()
        self.trainable_module = model
        self.trainable_module_ema = ModelEmaV3(model, decay=0.9)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.trainable_module(x), y)


def timm_task_ema() -> None:
    task = Task(resnet18())
    opt = torch.optim.SGD(task.trainable_module.parameters(), lr=0.01, momentum=0.9)
    for step in range(STEPS):
        task.train()
        loss = task(*images())
        opt.zero_grad()
        loss.backward()
        opt.step()
        task.trainable_module_ema.update(task.trainable_module, step=step)
        print(f"step {step}: loss {loss.item():.4f}")
        if step % EPOCH == EPOCH - 1:
            print(f"  ema top-1 {validate(task.trainable_module_ema):.2f}")


def bug_train_no_grad() -> None:
    wrapper = Wrapper(resnet18())
    net = wrapper.model
    opt = torch.optim.SGD(wrapper.parameters(), lr=0.01, momentum=0.9)
    for step in range(STEPS):
        wrapper.train()
        x, y = images()
        with torch.no_grad():  # the bug: meant for the augmentation, it holds the features too
            features = net.forward_head(net.forward_features(x), pre_logits=True)
        loss = F.cross_entropy(net.fc(features), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"step {step}: loss {loss.item():.4f}")
        if step % EPOCH == EPOCH - 1:
            print(f"  top-1 {validate(net):.2f}")


class LoraLinear(nn.Module):
    """peft's ``lora.Linear``: the frozen base layer plus ``lora_B(lora_A(x)) * scaling``."""

    def __init__(self, base: nn.Linear, rank: int = 4) -> None:
        super().__init__()
        self.base_layer = base.requires_grad_(False)
        self.lora_A = nn.Linear(base.in_features, rank, bias=False)
        self.lora_B = nn.Linear(rank, base.out_features, bias=False)
        nn.init.zeros_(self.lora_B.weight)
        self.scaling = 2.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.base_layer(x) + self.lora_B(self.lora_A(x)) * self.scaling
        return out


class Layer(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.q_proj = nn.Linear(dim, dim)
        self.k_proj = nn.Linear(dim, dim)
        self.v_proj = nn.Linear(dim, dim)
        self.o_proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 2 * dim)
        self.down = nn.Linear(2 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        q, k, v = self.q_proj(h), self.k_proj(h), self.v_proj(h)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o_proj(att)
        out: torch.Tensor = x + self.down(F.gelu(self.up(self.norm2(x))))
        return out


class Decoder(nn.Module):
    def __init__(self, layers: int = 32, dim: int = 16, vocab: int = 50) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Layer(dim) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        out: torch.Tensor = self.lm_head(self.norm(x))
        return out


def lora_32() -> None:
    torch.manual_seed(0)
    model = Decoder().requires_grad_(False)
    for layer in model.layers:  # peft's target_modules=["q_proj", "v_proj"]
        assert isinstance(layer, Layer)
        layer.q_proj = LoraLinear(layer.q_proj)
        layer.v_proj = LoraLinear(layer.v_proj)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    for step in range(STEPS):
        ids = torch.randint(0, 50, (2, 12))
        logits = model(ids[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, 50), ids[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"step {step}: loss {loss.item():.4f}")


def small_cnn(out: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                         nn.Conv2d(16, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16),
                         nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, out))


def mlp(dim: int, hidden: int, out: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(dim, hidden), nn.BatchNorm1d(hidden), nn.ReLU(),
                         nn.Linear(hidden, out))


class Byol(nn.Module):
    """byol-pytorch's ``BYOL``: the online encoder (the net and a projector), a predictor, and
    the target encoder, a deepcopy of the online one, frozen, updated by an EMA."""

    def __init__(self) -> None:
        super().__init__()
        self.online_encoder = nn.Sequential(small_cnn(32), mlp(32, 32, 16))
        self.online_predictor = mlp(16, 32, 16)
        self.target_encoder = copy.deepcopy(self.online_encoder).requires_grad_(False)

    def update_moving_average(self, beta: float = 0.99) -> None:
        with torch.no_grad():
            for t, o in zip(self.target_encoder.parameters(),
                            self.online_encoder.parameters(), strict=True):
                t.mul_(beta).add_(o, alpha=1 - beta)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        one, two = x + 0.1 * torch.randn_like(x), x.flip(-1)
        p1 = self.online_predictor(self.online_encoder(one))
        p2 = self.online_predictor(self.online_encoder(two))
        with torch.no_grad():
            t1, t2 = self.target_encoder(one), self.target_encoder(two)
        loss = (2 - 2 * F.cosine_similarity(p1, t2.detach(), dim=-1)) \
            + (2 - 2 * F.cosine_similarity(p2, t1.detach(), dim=-1))
        return loss.mean()


def byol_target() -> None:
    learner = Byol()
    params = [p for p in learner.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=0.05, momentum=0.9)
    for step in range(STEPS):
        x, _ = images(size=16)
        loss = learner(x)
        opt.zero_grad()
        loss.backward()
        opt.step()
        learner.update_moving_average()
        print(f"step {step}: loss {loss.item():.4f}")


HEALTHY: tuple[Callable[[], None], ...] = (timm_validate, timm_task_ema, lora_32, byol_target,
                                           timm_validate_grad, eval_finetune)
BUGS: tuple[Callable[[], None], ...] = (bug_train_no_grad, bug_eval_reset)

if __name__ == "__main__":
    torch.manual_seed(0)
    {f.__name__: f for f in HEALTHY + BUGS}[sys.argv[1]]()
