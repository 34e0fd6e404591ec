"""Blind set 5: training steps whose parts disagree, written without reading ``check``, each bug
taken from a real issue or forum thread (named in its docstring), one per CASE (argv[1]), and
healthy look-alikes (``ok_``) that must stay silent.

    python blind_bugs5.py CASE

Families (issue 36): the optimizer's update against the gradient, loss terms that reach nothing
trainable, hooks that pile up, custom autograd code, samples and positions that see what they
must not, several models whose relations contradict each other. Each docstring ends with the
culprit: what a user would want a finding to name. Every case trains a tiny model on random
data for a few steps on the CPU.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

STEPS = 4


def mlp(width: int = 8, hidden: int = 16, out: int = 4) -> nn.Sequential:
    return nn.Sequential(nn.Linear(width, hidden), nn.ReLU(), nn.Linear(hidden, out))


def data(n: int = 8, width: int = 8, classes: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(n, width), torch.randint(0, classes, (n,))


def train(model: nn.Module, opt: torch.optim.Optimizer, steps: int = STEPS,
          before_step: Callable[[], None] | None = None,
          after_step: Callable[[], None] | None = None) -> None:
    """The textbook loop: zero_grad, forward, backward, (before_step), step, (after_step)."""
    for _ in range(steps):
        x, y = data()
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        if before_step is not None:
            before_step()
        opt.step()
        if after_step is not None:
            after_step()


class Net(nn.Module):
    """backbone -> down -> head, the shape of a tracker or detector with a neck."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = mlp(8, 16, 16)
        self.down = nn.Linear(16, 8)
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> Any:
        return self.head(F.relu(self.down(self.backbone(x))))


# --- the optimizer's update against the gradient -------------------------------------------

def warmup_starts_at_zero() -> None:
    """A linear warmup ``lr = base * step / warmup`` (LambdaLR) makes the first optimizer step
    at lr 0: step 0's gradients move nothing. Source: EleutherAI/gpt-neox#1373 "step1 models are
    always the same as step0 models"; google-research/bert#1293. Culprit: the LambdaLR
    scheduler (param group 0's lr is 0 at step 0)."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: step / 100)
    train(model, opt, after_step=sched.step)


def steplr_every_batch() -> None:
    """StepLR(step_size=1, gamma=0.1) meant per epoch, stepped after every batch: the lr falls
    0.1, 0.01, ... 1e-6 within six batches and training stalls. Source: pytorch/vision#1261
    "Scheduler called at each step, instead of epoch"; ivadomed/ivadomed#55. Culprit: the StepLR
    scheduler stepped per batch (the lr of param group 0 shrinking to ~0)."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.1)
    train(model, opt, steps=7, after_step=sched.step)


def module_left_out_of_optimizer() -> None:
    """Param groups listed by hand (backbone, head) forget the neck ``down``: it gets gradients
    and never moves. Source: ohhhyeahhh/SiamCAR#18 "about trainable_params" (self.down is not
    in the optimizer). Culprit: module ``down``."""
    model = Net()
    opt = torch.optim.SGD([{"params": model.backbone.parameters(), "lr": 0.01},
                           {"params": model.head.parameters()}], lr=0.1, momentum=0.9)
    train(model, opt)


def unfrozen_after_optimizer_built() -> None:
    """The backbone starts frozen and the optimizer is built from ``filter(requires_grad)``, so
    its backbone group is empty; at step 2 the backbone is unfrozen but the optimizer is never
    rebuilt: the backbone gets gradients and never moves. Source: ohhhyeahhh/SiamCAR#18 (the
    comment "params is empty" for the backbone group). Culprit: module ``backbone``."""
    model = Net()
    for p in model.backbone.parameters():
        p.requires_grad_(False)
    opt = torch.optim.SGD([{"params": [p for p in model.backbone.parameters()
                                       if p.requires_grad], "lr": 0.01},
                           {"params": [*model.down.parameters(), *model.head.parameters()]}],
                          lr=0.1)
    for step in range(STEPS + 1):
        if step == 2:
            for p in model.backbone.parameters():
                p.requires_grad_(True)
        x, y = data()
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()


def group_lr_set_outside_loop() -> None:
    """A manual warmup builds AdamW at lr 0 with two groups (decay, no decay) and sets
    ``param_group["lr"] = lr`` after the ``for param_group in ...`` loop instead of inside it:
    only the last group (biases) ever gets an lr; the weights' group stays at lr 0. Source:
    rasbt/LLMs-from-scratch#692 "param_group["lr"] = lr should be inside the loop". Culprit: the
    optimizer's param group 0 (the weights), lr 0."""
    model = mlp()
    decay = [p for n, p in model.named_parameters() if n.endswith("weight")]
    no_decay = [p for n, p in model.named_parameters() if n.endswith("bias")]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}], lr=0.0)
    for step in range(STEPS):
        lr = 1e-2 * (step + 1) / STEPS
        logged = []
        for param_group in opt.param_groups:
            logged.append(param_group["lr"])
        param_group["lr"] = lr  # the bug: after the loop, so only the last group
        x, y = data()
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()


def clip_to_zero() -> None:
    """``clip_grad_norm_(params, max_norm=0)`` (0 meant "no clipping" in the config) scales every
    gradient to zero: the optimizer steps and nothing moves. Source: OpenNMT/OpenNMT-py#1140
    "Question about -max_grad_norm 0"; strands-labs/robots#2028 (0 of 34,701 parameters
    moved). Culprit: clip_grad_norm_ (max_norm 0)."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    train(model, opt, before_step=lambda: nn.utils.clip_grad_norm_(model.parameters(), 0.0))


def clip_negative() -> None:
    """``clip_grad_norm_`` with a negative max_norm flips every gradient's sign: SGD climbs the
    loss. Source: pytorch/pytorch#31367 "clip_grad_norm allows negative max_norm values".
    Culprit: clip_grad_norm_ (negative max_norm: updates along +g)."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    train(model, opt, steps=6,
          before_step=lambda: nn.utils.clip_grad_norm_(model.parameters(), -1.0))


def optimizer_rebuilt_every_step() -> None:
    """``optimizer = Adam(model.parameters())`` inside the loop: every step starts a new Adam
    with empty state (no moments, bias correction at step 1 again), so each update is
    lr * sign(g). Source: google-deepmind/weathernext#154 "optimizer initialization" (how often
    the optimizer is initialized changes the run). Culprit: the Adam optimizer, built anew each
    step (its state lost)."""
    model = mlp()
    for _ in range(STEPS):
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        x, y = data()
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()


def optimizer_on_first_instance() -> None:
    """The model is instantiated twice; the optimizer holds the first instance's parameters and
    the loop trains the second, which never moves. Source: spro/practical-pytorch#9 ("I have
    the model instantiated twice"). Culprit: the optimizer (it holds none of model ``model``'s
    parameters)."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model = mlp()
    train(model, opt)


def zero_grad_per_microbatch() -> None:
    """Gradient accumulation over 4 micro-batches with ``optimizer.zero_grad()`` inside the
    micro-batch loop: only the last micro-batch's gradient reaches the step. Source:
    bytetriper/RAE#67 "zero_grad is called per microbatch, breaking gradient accumulation";
    pytorch/torchtitan#3575. Culprit: optimizer.zero_grad() inside the accumulation loop."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        for _ in range(4):
            opt.zero_grad()
            x, y = data()
            (F.cross_entropy(model(x), y) / 4).backward()
        opt.step()


def scheduler_without_optimizer_step() -> None:
    """The loop calls ``scheduler.step()`` and never ``optimizer.step()``, believing the
    scheduler steps the optimizer. Source: pytorch/pytorch#3814 "Scheduler.step() doesn't
    perform optimizer.step()". Culprit: the SGD optimizer (never stepped)."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10)
    for _ in range(STEPS):
        x, y = data()
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        sched.step()


# --- loss terms that reach nothing trainable ------------------------------------------------

class SegNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.out = nn.Conv2d(4, 2, 1)

    def forward(self, x: torch.Tensor) -> Any:
        return self.out(F.relu(self.conv(x)))


def numpy_loss_term() -> None:
    """A boundary term computed in numpy from the prediction (``pred.detach().cpu().numpy()``,
    back with ``torch.from_numpy``) is added to the loss: it changes the loss value and carries
    no gradient. Source: JunMa11/SegLossOdyssey#17 "Will torch.no_grad() make it impossible to
    update the weight?". Culprit: the boundary loss term (cut by .numpy() / torch.from_numpy)."""
    model = SegNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(STEPS):
        x = torch.randn(4, 1, 8, 8)
        y = (x > 0).long().squeeze(1)
        opt.zero_grad()
        logits = model(x)
        prob = logits.softmax(1)[:, 1].detach().cpu().numpy()
        edge = np.abs(np.diff(prob, axis=-1)).mean()
        boundary = torch.from_numpy(np.asarray(edge, dtype=np.float32))
        (F.cross_entropy(logits, y) + 10.0 * boundary).backward()
        opt.step()


def kd_student_detached() -> None:
    """A distillation term compares ``sigmoid(student.detach())`` with the teacher: however
    large its weight alpha, the student learns from the label term only. Source:
    ultralytics/ultralytics#6197 ("No matter how I adjust alpha, the validation accuracy does
    not change"). Culprit: the distillation loss term (the student's output detached)."""
    student, teacher = mlp(), mlp(8, 32, 4)
    teacher.requires_grad_(False)
    opt = torch.optim.SGD(student.parameters(), lr=0.1)
    for _ in range(STEPS):
        x, _ = data()
        target = torch.randint(0, 2, (8, 4)).float()
        opt.zero_grad()
        scores = student(x)
        with torch.no_grad():
            soft = teacher(x).sigmoid()
        distill = F.binary_cross_entropy(scores.detach().sigmoid(), soft)
        hard = F.binary_cross_entropy_with_logits(scores, target)
        (5000.0 * distill + 0.3 * hard).backward()
        opt.step()


class AutoEncoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Conv2d(3, 8, 3, padding=1)
        self.dec = nn.Conv2d(8, 3, 3, padding=1)

    def forward(self, x: torch.Tensor) -> Any:
        return self.dec(F.relu(self.enc(x)))


def features() -> nn.Sequential:
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1))
    net.requires_grad_(False)
    return net.eval()


def perceptual_hook_detached() -> None:
    """A perceptual loss records the frozen feature net's activations with a forward hook that
    stores ``output.detach()``: the perceptual term reaches no trainable weight, only the L1
    term trains the model. Source: myscience/open-genie#6 "Question about the PerceptualLoss and
    RecordingProbe" (the recorded features are detached). Culprit: the perceptual loss term (the
    hook on ``features`` detaches its output)."""
    model, feats = AutoEncoder(), features()
    seen: list[torch.Tensor] = []
    feats[2].register_forward_hook(lambda m, i, o: seen.append(o.detach()))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(STEPS):
        x = torch.randn(2, 3, 8, 8)
        opt.zero_grad()
        out = model(x)
        seen.clear()
        feats(out)
        feats(x)
        perceptual = F.mse_loss(seen[0], seen[1])
        (F.l1_loss(out, x) + perceptual).backward()
        opt.step()


def perceptual_under_no_grad() -> None:
    """A CycleGAN perceptual term computed inside ``with torch.no_grad():`` (the generators'
    cycle and the VGG features alike): the term is a constant added to the loss. Source:
    junyanz/pytorch-CycleGAN-and-pix2pix#822 "If you want to use perceptual loss in your CycleGAN
    training". Culprit: the perceptual loss term (computed under torch.no_grad)."""
    gen_ab, gen_ba, vgg = AutoEncoder(), AutoEncoder(), features()
    opt = torch.optim.Adam([*gen_ab.parameters(), *gen_ba.parameters()], lr=1e-3)
    for _ in range(STEPS):
        a = torch.randn(2, 3, 8, 8)
        opt.zero_grad()
        cycle = F.l1_loss(gen_ba(gen_ab(a)), a)
        with torch.no_grad():
            rec = gen_ba(gen_ab(a))
            perceptual = F.mse_loss(vgg(rec), vgg(a))
        (cycle + 1.0 * perceptual).backward()
        opt.step()


def td_target_not_detached() -> None:
    """DQN with one network and no target network: ``q_target = r + gamma * q(s').max()`` is
    computed with gradient, so the loss also pushes q(s') towards q(s) (a residual gradient
    through the target). Source: philtabor/Deep-Q-Learning-Paper-To-Code#16 "No gradient
    required for q_target calculation"; abhi1345/deep-q-rank#4. Culprit: the target term (the
    second call of ``q``, on the next states, not detached)."""
    q = mlp(8, 16, 3)
    opt = torch.optim.Adam(q.parameters(), lr=1e-3)
    for _ in range(STEPS):
        s, s2 = torch.randn(8, 8), torch.randn(8, 8)
        a, r = torch.randint(0, 3, (8,)), torch.randn(8)
        opt.zero_grad()
        q_pred = q(s).gather(1, a[:, None]).squeeze(1)
        q_target = r + 0.99 * q(s2).max(1).values
        F.mse_loss(q_pred, q_target).backward()
        opt.step()


# --- hooks that pile up ---------------------------------------------------------------------

def grad_hook_every_step() -> None:
    """A layer-wise gradient multiplier (0.1 for the backbone) registered with
    ``p.register_hook`` inside the training loop: hooks pile up, the backbone's gradient is
    multiplied by 0.1, 0.01, 0.001, ... Source: NeuroBench/neurobench#184 "Memory leak" (hooks
    added on every run, never removed). Culprit: the gradient hooks on ``backbone``'s parameters,
    registered every step."""
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(STEPS + 2):
        for p in model.backbone.parameters():
            p.register_hook(lambda g: g * 0.1)
        x, y = data()
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()


def forward_hook_every_step() -> None:
    """A feature-matching term reads the encoder's output through a forward hook registered
    every step: after k steps the hook runs k times per call and the term counts the feature k
    times. Source: meta-pytorch/opacus#176 (forward hooks keep activations);
    NeuroBench/neurobench#184. Culprit: the forward hook on ``backbone``, registered every
    step."""
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    feats: list[torch.Tensor] = []
    for _ in range(STEPS + 2):
        model.backbone.register_forward_hook(lambda m, i, o: feats.append(o))
        feats.clear()
        x, y = data()
        opt.zero_grad()
        out = model(x)
        match = sum(f.pow(2).mean() for f in feats)
        (F.cross_entropy(out, y) + 0.1 * match).backward()
        opt.step()


# --- custom autograd code -------------------------------------------------------------------

class ISRLUWrong(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        nisr = torch.rsqrt(1.0 + torch.clamp(x, max=0.0) ** 2)
        ctx.save_for_backward(nisr)
        return x * nisr

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> torch.Tensor:
        (nisr,) = ctx.saved_tensors
        return nisr ** 3  # the bug: not multiplied by grad_out


class ISRLU(nn.Module):
    def __init__(self, fn: Any) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> Any:
        return self.fn.apply(x)


def isrlu_backward_ignores_grad() -> None:
    """A custom ISRLU ``autograd.Function`` whose backward returns the local derivative
    ``nisr ** 3`` without multiplying by ``grad_out``: every layer before it gets a gradient
    that does not depend on the loss. Source: pytorch/pytorch#4355 "gradcheck fails with cryptic
    error" (the ISRLU activation). Culprit: the autograd Function ISRLUWrong (its backward), in
    module ``1``."""
    model = nn.Sequential(nn.Linear(8, 16), ISRLU(ISRLUWrong), nn.Linear(16, 4))
    train(model, torch.optim.SGD(model.parameters(), lr=0.1))


class MulConstantWrong(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, constant: float) -> torch.Tensor:
        ctx.constant = constant
        return x * constant

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad_output, None  # the bug: should be grad_output * ctx.constant


class Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(8, 16)
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> Any:
        return self.head(MulConstantWrong.apply(F.relu(self.body(x)), 0.01))


def mulconstant_backward_drops_constant() -> None:
    """A ``MulConstant`` Function scales by 0.01 forward but its backward returns
    ``grad_output`` unscaled: ``body`` gets gradients 100 times too large. Source:
    zergtant/pytorch-handbook#69 (the MulConstant example's backward should be
    ``grad_output * ctx.constant``). Culprit: the autograd Function MulConstantWrong, in the
    forward of model ``model`` (root)."""
    model = Scaled()
    train(model, torch.optim.SGD(model.parameters(), lr=0.1))


class GRLModule(nn.Module):
    """A gradient reversal layer written as a module with a ``backward`` method, which autograd
    never calls."""

    def forward(self, x: torch.Tensor) -> Any:
        return x

    def backward(self, grad: torch.Tensor) -> Any:
        return -grad


class DANN(nn.Module):
    def __init__(self, grl: nn.Module) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Linear(8, 16), nn.ReLU())
        self.classifier = nn.Linear(16, 4)
        self.grl = grl
        self.domain = nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> Any:
        f = self.features(x)
        return self.classifier(f), self.domain(self.grl(f))


def dann_steps(model: DANN) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(STEPS):
        x, y = data()
        d = torch.randint(0, 2, (8,))
        opt.zero_grad()
        cls, dom = model(x)
        (F.cross_entropy(cls, y) + F.cross_entropy(dom, d)).backward()
        opt.step()


def grl_module_backward_never_called() -> None:
    """Domain-adversarial training whose gradient reversal layer is an ``nn.Module`` with a
    ``backward`` method: autograd never calls it, so the features learn to help the domain
    classifier instead of fooling it. Source: hash2430/pitchtron#3 "Does gradient reversal layer
    work?". Culprit: module ``grl``."""
    dann_steps(DANN(GRLModule()))


# --- samples and positions that see what they must not --------------------------------------

class RNNClassifier(nn.Module):
    def __init__(self, permute: bool) -> None:
        super().__init__()
        self.permute = permute
        self.rnn = nn.GRU(8, 6)
        self.head = nn.Linear(5 * 6, 4)

    def forward(self, x: torch.Tensor) -> Any:  # x: (T, B, F)
        out, _ = self.rnn(x)
        if self.permute:
            out = out.permute(1, 0, 2)
        return self.head(out.reshape(x.shape[1], -1))


def seq_data() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(5, 8, 8), torch.randint(0, 4, (8,))


def rnn_steps(model: nn.Module) -> None:
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(STEPS):
        x, y = seq_data()
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()


def view_mixes_samples() -> None:
    """The GRU's output (T, B, H) is reshaped to (B, T*H) without moving the batch axis first:
    each row the head sees mixes time steps of different samples. Source:
    vitrioil/Speech-Separation#4 "Reshaping issue" (view without permute "is mixing the data").
    Culprit: the reshape after ``rnn`` in model ``model``'s forward (root)."""
    rnn_steps(RNNClassifier(permute=False))


class Encoder(nn.Module):
    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), norm, nn.ReLU(), nn.Linear(16, 8))

    def forward(self, x: torch.Tensor) -> Any:
        return F.normalize(self.net(x), dim=1)


def contrastive_steps(model: nn.Module) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(STEPS):
        x = torch.randn(16, 8)
        q = model(x + 0.1 * torch.randn_like(x))
        k = model(x + 0.1 * torch.randn_like(x))
        opt.zero_grad()
        F.cross_entropy(q @ k.t() / 0.1, torch.arange(16)).backward()
        opt.step()


def batchnorm_contrastive() -> None:
    """InfoNCE between two views, each view's batch encoded through BatchNorm: the batch
    statistics leak between samples, and the model can "cheat" the pretext task. Source:
    facebookresearch/moco#137 "what information is leaked due to intra-batch communication?";
    TengdaHan/ShuffleBN#1. Culprit: module ``net.1`` (BatchNorm1d)."""
    contrastive_steps(Encoder(nn.BatchNorm1d(16)))


class Pooler(nn.Module):
    def __init__(self, masked: bool) -> None:
        super().__init__()
        self.masked = masked
        self.embed = nn.Embedding(20, 8, padding_idx=0)
        self.proj = nn.Linear(8, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, ids: torch.Tensor) -> Any:
        h = torch.tanh(self.proj(self.embed(ids)))
        if self.masked:
            mask = (ids != 0).unsqueeze(-1).float()
            pooled = (h * mask).sum(1) / mask.sum(1)
        else:
            pooled = h.mean(dim=1)
        return self.head(pooled)


def padded_ids() -> torch.Tensor:
    lengths = torch.tensor([3, 5, 2, 6, 4, 6, 1, 5])
    ids = torch.randint(1, 20, (8, 6))
    return ids * (torch.arange(6)[None] < lengths[:, None])


def pool_steps(model: nn.Module) -> None:
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(STEPS):
        ids, y = padded_ids(), torch.randint(0, 3, (8,))
        opt.zero_grad()
        F.cross_entropy(model(ids), y).backward()
        opt.step()


def mean_pool_over_padding() -> None:
    """Mean pooling over ``last_hidden_state.mean(dim=1)`` without the attention mask: padded
    positions enter the mean, so a sentence's embedding depends on the longest sentence of its
    batch. Source: jsboige/CoursIA#15045 "le pooling final inclut les positions de padding";
    huggingface/transformers#17463. Culprit: the mean pooling in model ``model``'s forward
    (root), over padded positions."""
    pool_steps(Pooler(masked=False))


class TinyLM(nn.Module):
    def __init__(self, mask: str) -> None:
        super().__init__()
        self.mask = mask
        self.embed = nn.Embedding(16, 16)
        self.attn = nn.MultiheadAttention(16, 2, batch_first=True)
        self.head = nn.Linear(16, 16)

    def forward(self, ids: torch.Tensor) -> Any:
        t = ids.shape[1]
        ones = torch.ones(t, t, dtype=torch.bool)
        masks = {"causal": torch.triu(ones, 1), "flipped": torch.tril(ones, -1),
                 "off_by_one": torch.triu(ones, 2)}
        h = self.embed(ids)
        out, _ = self.attn(h, h, h, attn_mask=masks[self.mask], need_weights=False)
        return self.head(out + h)


def lm_steps(model: nn.Module) -> None:
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(STEPS):
        ids = torch.randint(0, 16, (4, 7))
        opt.zero_grad()
        logits = model(ids[:, :-1])
        F.cross_entropy(logits.reshape(-1, 16), ids[:, 1:].reshape(-1)).backward()
        opt.step()


def causal_mask_flipped() -> None:
    """The causal mask masks the past instead of the future (``tril`` where ``triu`` was meant):
    position t attends to every later token it is trained to predict. Source:
    pytorch/examples#649 "Transformer Language Model Example Wrong Mask". Culprit: module
    ``attn`` (its attn_mask lets t see t+1...)."""
    lm_steps(TinyLM("flipped"))


def causal_mask_off_by_one() -> None:
    """``torch.triu(ones, diagonal=2)`` for the causal mask: position t also sees t+1, the token
    it must predict. Source: RVC-Boss/GPT-SoVITS#965 (the causal mask's diagonal). Culprit:
    module ``attn`` (its attn_mask lets t see t+1)."""
    lm_steps(TinyLM("off_by_one"))


class PadAttention(nn.Module):
    def __init__(self, inverted: bool) -> None:
        super().__init__()
        self.inverted = inverted
        self.embed = nn.Embedding(20, 16, padding_idx=0)
        self.attn = nn.MultiheadAttention(16, 2, batch_first=True)
        self.head = nn.Linear(16, 3)

    def forward(self, ids: torch.Tensor) -> Any:
        valid = ids != 0
        h = self.embed(ids)
        out, _ = self.attn(h, h, h, key_padding_mask=valid if self.inverted else ~valid,
                           need_weights=False)
        return self.head(out[:, 0])


def pad_ids() -> torch.Tensor:
    lengths = torch.tensor([3, 5, 2, 4, 4, 5, 1, 5])  # every row has padding
    return torch.randint(1, 20, (8, 6)) * (torch.arange(6)[None] < lengths[:, None])


def pad_steps(model: nn.Module) -> None:
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(STEPS):
        opt.zero_grad()
        F.cross_entropy(model(pad_ids()), torch.randint(0, 3, (8,))).backward()
        opt.step()


def key_padding_mask_inverted() -> None:
    """``key_padding_mask=(ids != PAD)``: MultiheadAttention ignores the positions marked True,
    so every query attends to the padding only and none of the real tokens. Source:
    mlwithme/TransformerTranslation#2; pytorch/pytorch#39321 (True means "ignore"). Culprit:
    module ``attn`` (key_padding_mask inverted)."""
    pad_steps(PadAttention(inverted=True))


class NextStep(nn.Module):
    def __init__(self, causal: bool) -> None:
        super().__init__()
        self.causal = causal
        self.inp = nn.Linear(4, 16)
        layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
        self.out = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> Any:
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1]) if self.causal else None
        return self.out(self.encoder(self.inp(x), mask=mask, is_causal=self.causal))


def next_step_steps(model: nn.Module) -> None:
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(STEPS):
        seq = torch.randn(4, 7, 4).cumsum(1)
        opt.zero_grad()
        F.mse_loss(model(seq[:, :-1]), seq[:, 1:]).backward()
        opt.step()


def encoder_without_causal_mask() -> None:
    """An autoregressive model (predict step t+1 from steps <= t) built on a TransformerEncoder
    with no causal mask: every position sees the whole sequence, the targets included. Source:
    kzl/decision-transformer#30 "Attention mask allows access to future tokens?". Culprit:
    module ``encoder`` (no causal mask)."""
    next_step_steps(NextStep(causal=False))


# --- several models whose relations contradict each other -----------------------------------

def ema_update(ema: nn.Module, model: nn.Module, decay: float = 0.9) -> None:
    with torch.no_grad():
        for e, p in zip(ema.parameters(), model.parameters(), strict=True):
            e.lerp_(p, 1.0 - decay)


def ema_copied_into_model() -> None:
    """Validation with EMA weights copies them into the live model (``ema.copy_to``) and never
    restores the live weights: after every validation the model restarts from the slow EMA
    average, training undone. Source: PKU-YuanGroup/Open-Sora-Plan#186 "Missed to restore model
    weights in training after validation with EMA on". Culprit: the copy of model ``ema`` into
    model ``model`` (never restored)."""
    model, ema = mlp(), mlp()
    ema.load_state_dict(model.state_dict())
    ema.requires_grad_(False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(STEPS + 2):
        x, y = data()
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        ema_update(ema, model)
        if step % 2 == 1:  # validate with the EMA weights
            model.load_state_dict(ema.state_dict())
            with torch.no_grad():
                model(torch.randn(8, 8))


def ema_rebinds_instead_of_copying() -> None:
    """The EMA update ``for ema_p, p in zip(...): ema_p = decay * ema_p + (1 - decay) * p``
    rebinds the loop variable: the EMA model never changes while it is used as the teacher.
    Source: YU1ut/MixMatch-pytorch#23 "fix parameter assignment bug" (an assignment that does
    not copy). Culprit: the EMA update of model ``ema`` (it never changes)."""
    model, ema = mlp(), mlp()
    ema.load_state_dict(model.state_dict())
    ema.requires_grad_(False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(STEPS + 2):
        x, y = data()
        opt.zero_grad()
        with torch.no_grad():
            soft = ema(x).softmax(1)
        out = model(x)
        (F.cross_entropy(out, y) + F.kl_div(out.log_softmax(1), soft,
                                            reduction="batchmean")).backward()
        opt.step()
        for ema_p, p in zip(ema.parameters(), model.parameters(), strict=True):
            ema_p = 0.9 * ema_p + 0.1 * p  # the bug: rebinds the name, copies nothing


def target_critic_hard_copied() -> None:
    """The target critic's "soft" update is ``target.load_state_dict(critic.state_dict())``
    every step: tau is ignored, the target is the critic itself, and the TD target moves with
    every update. Source: philtabor/Multi-Agent-Deep-Deterministic-Policy-Gradients#10 (the
    target critic always equals the critic). Culprit: the update of model ``target`` (a full
    copy of ``critic`` every step)."""
    critic, target = mlp(8, 16, 1), mlp(8, 16, 1)
    target.requires_grad_(False)
    opt = torch.optim.Adam(critic.parameters(), lr=1e-3)
    for _ in range(STEPS + 2):
        s, s2, r = torch.randn(8, 8), torch.randn(8, 8), torch.randn(8, 1)
        with torch.no_grad():
            y = r + 0.99 * target(s2)
        opt.zero_grad()
        F.mse_loss(critic(s), y).backward()
        opt.step()
        target.load_state_dict(critic.state_dict())


# --- healthy look-alikes --------------------------------------------------------------------

def ok_warmup_from_small_lr() -> None:
    """Linear warmup from a small lr: ``(step + 1) / warmup``."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: (step + 1) / 100)
    train(model, opt, after_step=sched.step)


def ok_steplr_per_epoch() -> None:
    """StepLR stepped once per epoch of three batches."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    for _ in range(2):
        train(model, opt, steps=3)
        sched.step()


def ok_unfreeze_adds_param_group() -> None:
    """The backbone starts frozen and out of the optimizer; at unfreeze it is added with
    ``add_param_group``."""
    model = Net()
    model.backbone.requires_grad_(False)
    opt = torch.optim.SGD([*model.down.parameters(), *model.head.parameters()], lr=0.1)
    for step in range(STEPS + 1):
        if step == 2:
            model.backbone.requires_grad_(True)
            opt.add_param_group({"params": model.backbone.parameters(), "lr": 0.01})
        x, y = data()
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()


def ok_backbone_small_lr() -> None:
    """Two groups: the backbone at a tenth of the head's lr, with momentum."""
    model = Net()
    opt = torch.optim.SGD([{"params": model.backbone.parameters(), "lr": 0.01},
                           {"params": [*model.down.parameters(), *model.head.parameters()]}],
                          lr=0.1, momentum=0.9)
    train(model, opt)


def ok_clip_grad_norm() -> None:
    """``clip_grad_norm_(params, 0.05)`` between backward and step, clipping for real."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    train(model, opt, before_step=lambda: nn.utils.clip_grad_norm_(model.parameters(), 0.05))


def ok_accumulation() -> None:
    """Gradient accumulation over 4 micro-batches: zero_grad before the first, step after the
    last, each loss divided by 4."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        opt.zero_grad()
        for _ in range(4):
            x, y = data()
            (F.cross_entropy(model(x), y) / 4).backward()
        opt.step()


def ok_adam_built_once() -> None:
    """Adam built once before the loop, weight decay on."""
    model = mlp()
    train(model, torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01))


def ok_distance_map_weight() -> None:
    """A boundary weight map computed in numpy from the *target* (no gradient needed) multiplies
    the per-pixel loss of the prediction: the gradient flows through the prediction."""
    model = SegNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(STEPS):
        x = torch.randn(4, 1, 8, 8)
        y = (x > 0).long().squeeze(1)
        edges = np.abs(np.diff(y.numpy(), axis=-1, append=0)).astype(np.float32)
        weight = torch.from_numpy(1.0 + edges)
        opt.zero_grad()
        (F.cross_entropy(model(x), y, reduction="none") * weight).mean().backward()
        opt.step()


def ok_kd_teacher_no_grad() -> None:
    """Distillation: the teacher runs under no_grad, the student's logits are not detached."""
    student, teacher = mlp(), mlp(8, 32, 4)
    teacher.requires_grad_(False)
    opt = torch.optim.SGD(student.parameters(), lr=0.1)
    for _ in range(STEPS):
        x, y = data()
        with torch.no_grad():
            soft = (teacher(x) / 2.0).softmax(1)
        opt.zero_grad()
        out = student(x)
        kd = F.kl_div((out / 2.0).log_softmax(1), soft, reduction="batchmean") * 4.0
        (0.5 * kd + 0.5 * F.cross_entropy(out, y)).backward()
        opt.step()


def ok_perceptual_frozen_vgg() -> None:
    """A perceptual loss through a frozen feature net, not detached: the gradient reaches the
    generator through the frozen layers."""
    model, feats = AutoEncoder(), features()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(STEPS):
        x = torch.randn(2, 3, 8, 8)
        opt.zero_grad()
        out = model(x)
        (F.l1_loss(out, x) + F.mse_loss(feats(out), feats(x).detach())).backward()
        opt.step()


def ok_gan_toggle_requires_grad() -> None:
    """A GAN that sets the discriminator's requires_grad False around the generator's step and
    back to True for its own."""
    gen, disc = mlp(4, 16, 8), mlp(8, 16, 1)
    opt_g = torch.optim.Adam(gen.parameters(), lr=1e-3)
    opt_d = torch.optim.Adam(disc.parameters(), lr=1e-3)
    for _ in range(STEPS):
        real, z = torch.randn(8, 8), torch.randn(8, 4)
        fake = gen(z)
        disc.requires_grad_(True)
        opt_d.zero_grad()
        d_loss = (F.binary_cross_entropy_with_logits(disc(real), torch.ones(8, 1))
                  + F.binary_cross_entropy_with_logits(disc(fake.detach()), torch.zeros(8, 1)))
        d_loss.backward()
        opt_d.step()
        disc.requires_grad_(False)
        opt_g.zero_grad()
        F.binary_cross_entropy_with_logits(disc(fake), torch.ones(8, 1)).backward()
        opt_g.step()


class Monitored(nn.Module):
    """Calls ``body`` twice: once to train, once on a clean copy of the input whose output is
    only logged."""

    def __init__(self) -> None:
        super().__init__()
        self.body = mlp()
        self.clean_norm = 0.0

    def forward(self, x: torch.Tensor) -> Any:
        out = self.body(x + 0.1 * torch.randn_like(x))
        self.clean_norm = float(self.body(x).detach().norm())
        return out


def ok_module_twice_monitored() -> None:
    """A module called twice in one forward; the second output is only monitored (detached)."""
    model = Monitored()
    train(model, torch.optim.SGD(model.parameters(), lr=0.1))


def ok_td_target_network() -> None:
    """DQN: the target from a target network under no_grad, soft-updated with tau 0.1."""
    q, target = mlp(8, 16, 3), mlp(8, 16, 3)
    target.load_state_dict(q.state_dict())
    target.requires_grad_(False)
    opt = torch.optim.Adam(q.parameters(), lr=1e-3)
    for _ in range(STEPS + 2):
        s, s2 = torch.randn(8, 8), torch.randn(8, 8)
        a, r = torch.randint(0, 3, (8,)), torch.randn(8)
        with torch.no_grad():
            q_target = r + 0.99 * target(s2).max(1).values
        opt.zero_grad()
        F.mse_loss(q(s).gather(1, a[:, None]).squeeze(1), q_target).backward()
        opt.step()
        ema_update(target, q)


def ok_grad_hook_once() -> None:
    """The backbone's gradient multiplier registered once, before the loop."""
    model = Net()
    for p in model.backbone.parameters():
        p.register_hook(lambda g: g * 0.1)
    train(model, torch.optim.SGD(model.parameters(), lr=0.1), steps=STEPS + 2)


class ISRLURight(ISRLUWrong):
    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> torch.Tensor:
        (nisr,) = ctx.saved_tensors
        return grad_out * nisr ** 3


class GradReverse(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return -grad


class GRLFunction(nn.Module):
    def forward(self, x: torch.Tensor) -> Any:
        return GradReverse.apply(x)


def ok_custom_function() -> None:
    """The ISRLU Function with a correct backward (``grad_out * nisr ** 3``)."""
    model = nn.Sequential(nn.Linear(8, 16), ISRLU(ISRLURight), nn.Linear(16, 4))
    train(model, torch.optim.SGD(model.parameters(), lr=0.1))


def ok_grad_reverse_function() -> None:
    """Domain-adversarial training with the reversal as an ``autograd.Function``: the features
    get the domain classifier's gradient reversed."""
    dann_steps(DANN(GRLFunction()))


def ok_permute_then_reshape() -> None:
    """The GRU's output moved to (B, T, H) before the reshape."""
    rnn_steps(RNNClassifier(permute=True))


def ok_groupnorm_contrastive() -> None:
    """The same InfoNCE with GroupNorm: no statistic crosses samples."""
    contrastive_steps(Encoder(nn.GroupNorm(4, 16)))


def ok_masked_mean_pool() -> None:
    """Mean pooling weighted by the attention mask."""
    pool_steps(Pooler(masked=True))


def ok_causal_mask() -> None:
    """A correct causal mask (``triu(ones, 1)``)."""
    lm_steps(TinyLM("causal"))


def ok_key_padding_mask() -> None:
    """``key_padding_mask=(ids == PAD)``, True where padded."""
    pad_steps(PadAttention(inverted=False))


def ok_encoder_causal() -> None:
    """The next-step TransformerEncoder with its causal mask."""
    next_step_steps(NextStep(causal=True))


def ok_ema_teacher() -> None:
    """Mean teacher: the EMA model, updated in place under no_grad, gives the targets."""
    model, ema = mlp(), mlp()
    ema.load_state_dict(model.state_dict())
    ema.requires_grad_(False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(STEPS + 2):
        x, y = data()
        with torch.no_grad():
            soft = ema(x).softmax(1)
        opt.zero_grad()
        out = model(x)
        (F.cross_entropy(out, y) + F.kl_div(out.log_softmax(1), soft,
                                            reduction="batchmean")).backward()
        opt.step()
        ema_update(ema, model)


def ok_ema_validate_and_restore() -> None:
    """Validation with the EMA weights: the live weights stored, swapped in, and restored."""
    model, ema = mlp(), mlp()
    ema.load_state_dict(model.state_dict())
    ema.requires_grad_(False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(STEPS + 2):
        x, y = data()
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        ema_update(ema, model)
        if step % 2 == 1:
            live = {k: v.clone() for k, v in model.state_dict().items()}
            model.load_state_dict(ema.state_dict())
            with torch.no_grad():
                model(torch.randn(8, 8))
            model.load_state_dict(live)


def cases(names: tuple[Callable[[], None], ...]) -> Iterator[tuple[str, Callable[[], None]]]:
    return ((fn.__name__, fn) for fn in names)


BUGS: tuple[Callable[[], None], ...] = (
    warmup_starts_at_zero, steplr_every_batch, module_left_out_of_optimizer,
    unfrozen_after_optimizer_built, group_lr_set_outside_loop, clip_to_zero, clip_negative,
    optimizer_rebuilt_every_step, optimizer_on_first_instance, zero_grad_per_microbatch,
    scheduler_without_optimizer_step, numpy_loss_term, kd_student_detached,
    perceptual_hook_detached, perceptual_under_no_grad, td_target_not_detached,
    grad_hook_every_step, forward_hook_every_step, isrlu_backward_ignores_grad,
    mulconstant_backward_drops_constant, grl_module_backward_never_called, view_mixes_samples,
    batchnorm_contrastive, mean_pool_over_padding, causal_mask_flipped, causal_mask_off_by_one,
    key_padding_mask_inverted, encoder_without_causal_mask, ema_copied_into_model,
    ema_rebinds_instead_of_copying, target_critic_hard_copied,
)
HEALTHY: tuple[Callable[[], None], ...] = (
    ok_warmup_from_small_lr, ok_steplr_per_epoch, ok_unfreeze_adds_param_group,
    ok_backbone_small_lr, ok_clip_grad_norm, ok_accumulation, ok_adam_built_once,
    ok_distance_map_weight, ok_kd_teacher_no_grad, ok_perceptual_frozen_vgg,
    ok_gan_toggle_requires_grad, ok_module_twice_monitored, ok_td_target_network,
    ok_grad_hook_once, ok_custom_function, ok_grad_reverse_function, ok_permute_then_reshape,
    ok_groupnorm_contrastive, ok_masked_mean_pool, ok_causal_mask, ok_key_padding_mask,
    ok_encoder_causal, ok_ema_teacher, ok_ema_validate_and_restore,
)
CASES = dict(cases(BUGS + HEALTHY))


if __name__ == "__main__":
    torch.manual_seed(0)
    CASES[sys.argv[1]]()
    print(f"{sys.argv[1]}: done")
