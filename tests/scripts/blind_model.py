"""Gradient-flow bugs in model and forward code written blind (before reading hooktrace's checks
or the other bug scripts), each modelled on a forum question, one per CASE (argv[1]), and healthy
look-alikes (``ok_*``) that must stay silent. Each trains a tiny model on CPU for a few steps,
seeded."""

from __future__ import annotations

import itertools
import math
import sys
from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

STEPS = 4


def mlp(*sizes: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(sizes):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, lr: float = 0.1,
          loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = F.cross_entropy,
          steps: int = STEPS) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    for _ in range(steps):
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        print(f"loss {loss.item():.4f}")


def labels(n: int = 16, classes: int = 3) -> torch.Tensor:
    return torch.randint(0, classes, (n,))


# --- attention ---------------------------------------------------------------------------------


class AttnPool(nn.Module):
    """Attention pooling over a sequence; ``dim`` is the softmax's dim over the scores (B, T, 1)."""

    def __init__(self, d: int, dim: int) -> None:
        super().__init__()
        self.score = nn.Linear(d, 1)
        self.dim = dim

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        w = torch.softmax(self.score(h), dim=self.dim)
        return (w * h).sum(1)


class PoolClassifier(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.embed = nn.Linear(8, 16)
        self.pool = AttnPool(16, dim)
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.pool(torch.tanh(self.embed(x))))


def softmax_singleton_dim() -> None:
    # "my attention weights are all 1.0 and the attention scorer never learns": softmax over the
    # size-1 last dim of the (B, T, 1) scores, not over T: every weight is 1, the scorer's
    # gradient 0
    train(PoolClassifier(dim=-1), torch.randn(16, 5, 8), labels())


def ok_attn_pool() -> None:
    # the same pooling with the softmax over the sequence dim
    train(PoolClassifier(dim=1), torch.randn(16, 5, 8), labels())


class TokenClassifier(nn.Module):
    def __init__(self, invert_mask: bool) -> None:
        super().__init__()
        self.emb = nn.Embedding(20, 16, padding_idx=0)
        self.attn = nn.MultiheadAttention(16, 2, batch_first=True)
        self.head = nn.Linear(16, 3)
        self.invert_mask = invert_mask

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.emb(tokens)
        pad = tokens == 0
        mask = ~pad if self.invert_mask else pad
        out, _ = self.attn(h, h, h, key_padding_mask=mask)
        return self.head(out.mean(1))


def padded_tokens() -> torch.Tensor:
    tokens = torch.randint(1, 20, (16, 6))
    tokens[::2, 4:] = 0  # every other sequence is padded; the others are full length
    return tokens


def mha_mask_inverted() -> None:
    # "loss is nan from the first batch with nn.MultiheadAttention": key_padding_mask built as
    # True for real tokens (True means *ignore*): a sequence without padding has every key masked,
    # its softmax is over all -inf, NaN
    train(TokenClassifier(invert_mask=True), padded_tokens(), labels())


def ok_mha_padding() -> None:
    # the same model with the mask True on padding, every sequence keeps real tokens
    train(TokenClassifier(invert_mask=False), padded_tokens(), labels())


class ScaledSelfAttention(nn.Module):
    def __init__(self, d: int, typo: bool) -> None:
        super().__init__()
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.scale = math.sqrt(d) if typo else 1 / math.sqrt(d)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        scores = self.q(h) @ self.k(h).transpose(-2, -1) * self.scale
        return torch.softmax(scores, dim=-1) @ self.v(h)


class AttnClassifier(nn.Module):
    def __init__(self, attn: nn.Module) -> None:
        super().__init__()
        self.embed = nn.Linear(8, 64)
        self.attn = attn
        self.head = nn.Linear(64, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.attn(self.embed(x)).mean(1))


def attn_scale_multiplied() -> None:
    # "q and k projections of my transformer don't learn, attention is one-hot": scores multiplied
    # by sqrt(d) instead of divided (on raw, unnormalised features): the softmax saturates to
    # one-hot, q and k get no gradient (v does)
    train(AttnClassifier(ScaledSelfAttention(64, typo=True)), 30 * torch.randn(16, 6, 8), labels())


def naive_softmax(s: torch.Tensor) -> torch.Tensor:
    e = torch.exp(s)  # no max subtracted: exp overflows to inf above 88
    return e / e.sum(-1, keepdim=True)


class NaiveAttention(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.d = d

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        scores = self.q(h) @ self.k(h).transpose(-2, -1) / math.sqrt(self.d)
        return naive_softmax(scores) @ self.v(h)


def softmax_overflow() -> None:
    # "loss becomes nan after a few iterations with my own attention": a hand-written softmax
    # exp(s) / sum(exp(s)) overflows to inf/inf once the scores grow past 88
    train(AttnClassifier(NaiveAttention(64)), 6 * torch.randn(16, 6, 8), labels(), steps=5)


# --- discretisation ------------------------------------------------------------------------------


class FakeQuant(nn.Module):
    def __init__(self, straight_through: bool, levels: int = 15) -> None:
        super().__init__()
        self.levels = levels
        self.straight_through = straight_through

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = torch.round(x.clamp(0, 1) * self.levels) / self.levels
        return x + (q - x).detach() if self.straight_through else q


class QuantMLP(nn.Module):
    def __init__(self, straight_through: bool) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 32)
        self.quant = FakeQuant(straight_through)
        self.fc2 = nn.Linear(32, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.quant(torch.sigmoid(self.fc1(x))))


def fakequant_round() -> None:
    # "quantization-aware training: every layer before the quantizer has zero gradients":
    # torch.round has gradient 0 everywhere, there is no straight-through estimator
    train(QuantMLP(straight_through=False), torch.randn(16, 8), labels())


def ok_ste_round() -> None:
    # the same quantizer with the straight-through estimator x + (q - x).detach()
    train(QuantMLP(straight_through=True), torch.randn(16, 8), labels())


class VectorQuantizer(nn.Module):
    def __init__(self, codes: int, d: int) -> None:
        super().__init__()
        self.codebook = nn.Embedding(codes, d)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        idx = torch.cdist(z, self.codebook.weight).argmin(-1)
        return self.codebook(idx)


class VQAutoencoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = mlp(8, 16, 4)
        self.vq = VectorQuantizer(16, 4)
        self.decoder = mlp(4, 16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.vq(self.encoder(x)))


def vq_no_straight_through() -> None:
    # "VQ-VAE: the encoder's gradients are None": the codebook lookup by argmin indices has no
    # gradient to the encoder's output (no z + (q - z).detach(), no commitment loss)
    x = torch.randn(16, 8)
    train(VQAutoencoder(), x, x, loss_fn=F.mse_loss)


class HardGate(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.value = nn.Linear(d, d)
        self.gate = nn.Linear(d, d)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        g = (self.gate(h) > 0).float()  # a comparison: no gradient reaches self.gate
        return g * torch.relu(self.value(h))


class GatedNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(8, 16)
        self.block = HardGate(16)
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(self.embed(x)))


def hard_gate() -> None:
    # "the weights of my gating layer never change": the gate is (gate(h) > 0).float(), a step
    # function with no gradient
    train(GatedNet(), torch.randn(16, 8), labels())


class MaskedMeanNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(20, 16, padding_idx=0)
        self.gate = nn.Linear(16, 16)
        self.head = nn.Linear(16, 3)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        keep = (tokens != 0).float().unsqueeze(-1)  # a hard mask from the data, not from a layer
        h = self.emb(tokens) * torch.sigmoid(self.gate(self.emb(tokens)))
        return self.head((h * keep).sum(1) / keep.sum(1))


def ok_data_mask() -> None:
    # a (tokens != 0).float() padding mask times a soft sigmoid gate: comparisons on data are fine
    train(MaskedMeanNet(), padded_tokens(), labels())


# --- normalisation, dropout, numerics ------------------------------------------------------------


class NormedRegressor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = mlp(8, 32, 1)
        self.norm = nn.LayerNorm(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.body(x))


def layernorm_size1() -> None:
    # "added LayerNorm to stabilise the output, now the model predicts a constant": LayerNorm over
    # a dim of size 1: x - mean is 0, the output is the norm's bias, the body gets zero gradient
    x = torch.randn(16, 8)
    train(NormedRegressor(), x, x.sum(1, keepdim=True), loss_fn=F.mse_loss)


class TFPortMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 32)
        self.drop = nn.Dropout(p=1.0)  # ported from TensorFlow's keep_prob=1.0
        self.fc2 = nn.Linear(32, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.drop(torch.relu(self.fc1(x))))


def dropout_keep_prob() -> None:
    # "ported my TF model, the first layer doesn't learn": nn.Dropout(p=1.0) from keep_prob=1.0
    # drops everything in training, fc1 gets zero gradient
    train(TFPortMLP(), torch.randn(16, 8), labels())


class PairwiseDistance(nn.Module):
    def __init__(self, eps: float) -> None:
        super().__init__()
        self.eps = eps

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return ((z[:, None] - z[None]) ** 2).sum(-1).add(self.eps).sqrt()


class Siamese(nn.Module):
    def __init__(self, eps: float) -> None:
        super().__init__()
        self.embed = mlp(8, 32, 16)
        self.dist = PairwiseDistance(eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dist(self.embed(x))


def contrastive(d: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    same = (y[:, None] == y[None]).float()
    return (same * d ** 2 + (1 - same) * F.relu(2.0 - d) ** 2).mean()


def pairwise_sqrt_zero() -> None:
    # "NaN gradients in my contrastive loss after the first step": a hand-written distance
    # sqrt(sum((a - b)^2)) on the diagonal where a == b: the gradient of sqrt at 0 is inf, times 0
    # is nan
    train(Siamese(eps=0.0), torch.randn(16, 8), labels(), loss_fn=contrastive, lr=0.01)


def ok_pair_dist_eps() -> None:
    # the same distance with an epsilon under the sqrt
    train(Siamese(eps=1e-9), torch.randn(16, 8), labels(), loss_fn=contrastive, lr=0.01)


# --- recurrence, custom autograd, parameters, depth ----------------------------------------------


class ElmanRNN(nn.Module):
    def __init__(self, reset_inside: bool) -> None:
        super().__init__()
        self.ih = nn.Linear(8, 16)
        self.hh = nn.Linear(16, 16)
        self.head = nn.Linear(16, 3)
        self.reset_inside = reset_inside

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.new_zeros(x.shape[0], 16)
        for t in range(x.shape[1]):
            if self.reset_inside:
                h = x.new_zeros(x.shape[0], 16)  # the bug: the state is re-initialised every step
            h = torch.tanh(self.ih(x[:, t]) + self.hh(h))
        return self.head(h)


def rnn_hidden_reset() -> None:
    # "the hidden-to-hidden weights of my hand-written RNN never change": h = zeros(...) inside the
    # time loop, so hh only ever multiplies zeros and its weight gets zero gradient
    train(ElmanRNN(reset_inside=True), torch.randn(16, 5, 8), labels())


def ok_rnn_loop() -> None:
    # the same RNN with the state initialised once, before the loop
    train(ElmanRNN(reset_inside=False), torch.randn(16, 5, 8), labels())


class ClipGradFn(torch.autograd.Function):
    """Identity forward; backward meant to clip the gradient to [-1, 1]."""

    @staticmethod
    def forward(ctx: object, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> None:
        grad.clamp_(-1, 1)  # the bug: no `return grad`, so the gradient is None


class GradClip(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ClipGradFn.apply(x)  # type: ignore[no-any-return]


class ClippedNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = mlp(8, 32, 16)
        self.clip = GradClip()
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.clip(self.encoder(x)))


def custom_fn_no_return() -> None:
    # "gradients of every layer before my custom autograd Function are None": its backward clips
    # the gradient in place and forgets to return it
    train(ClippedNet(), torch.randn(16, 8), labels())


class TempScaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = mlp(8, 16, 3)
        self.log_temp = torch.zeros(1, requires_grad=True)  # a plain tensor, not an nn.Parameter

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x) / self.log_temp.exp()


def plain_tensor_param() -> None:
    # "my learnable temperature never changes": a tensor with requires_grad=True assigned to the
    # module is not registered, model.parameters() (and so the optimizer) never sees it
    train(TempScaled(), torch.randn(16, 8), labels())


class HalvingBlock(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.f = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x + torch.tanh(self.f(x))) * 0.5  # "average skip and branch": halves every block


class HalvingResNet(nn.Module):
    def __init__(self, depth: int = 24) -> None:
        super().__init__()
        self.stem = nn.Linear(8, 16)
        self.blocks = nn.Sequential(*(HalvingBlock(16) for _ in range(depth)))
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)))


def residual_halving() -> None:
    # "the first layers of my deep residual net don't learn": each block returns (x + f(x)) * 0.5,
    # the signal and the gradient halve 24 times: the stem's gradient is ~1e-7 of the head's
    train(HalvingResNet(), torch.randn(16, 8), labels())


class Distiller(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.student = mlp(8, 16, 3)
        self.teacher = mlp(8, 32, 3)
        self.teacher.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            target = torch.softmax(self.teacher(x), -1)
        return -(target * torch.log_softmax(self.student(x), -1)).sum(-1).mean()


def ok_frozen_teacher() -> None:
    # knowledge distillation: a frozen teacher under no_grad inside the model, only the student
    # learns
    model = Distiller()
    optimizer = torch.optim.SGD(model.student.parameters(), lr=0.1)
    x = torch.randn(16, 8)
    for _ in range(STEPS):
        optimizer.zero_grad()
        loss = model(x)
        loss.backward()
        optimizer.step()
        print(f"loss {loss.item():.4f}")


CASES: dict[str, Callable[[], None]] = {f.__name__: f for f in (
    softmax_singleton_dim, mha_mask_inverted, attn_scale_multiplied, softmax_overflow,
    fakequant_round, vq_no_straight_through, hard_gate, layernorm_size1, dropout_keep_prob,
    pairwise_sqrt_zero, rnn_hidden_reset, custom_fn_no_return, plain_tensor_param,
    residual_halving,
    ok_attn_pool, ok_mha_padding, ok_ste_round, ok_data_mask, ok_pair_dist_eps, ok_rnn_loop,
    ok_frozen_teacher,
)}

if __name__ == "__main__":
    torch.manual_seed(0)
    CASES[sys.argv[1]]()
