"""Third blind set: realistic gradient-flow bugs written without reading the check code or the
other bug scripts, one per CASE (argv[1]), and healthy look-alikes (``ok_*``) that must stay
silent. Each comment: forum symptom / real cause / what a good debugger should name.
Each case trains a tiny seeded model on CPU for a few steps."""

from __future__ import annotations

import itertools
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


def train(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
          optimizer: torch.optim.Optimizer | None = None, lr: float = 0.1,
          loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = F.cross_entropy,
          steps: int = STEPS) -> None:
    optimizer = optimizer or torch.optim.SGD(model.parameters(), lr=lr)
    for _ in range(steps):
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        print(f"loss {loss.item():.4f}")


def batch(n: int = 16, features: int = 8, classes: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(n, features), torch.randint(0, classes, (n,))


# ---------------------------------------------------------------- bugs


class Seq2Seq(nn.Module):
    def __init__(self, detach: bool) -> None:
        super().__init__()
        self.detach = detach
        self.encoder = nn.GRU(8, 16, batch_first=True)
        self.decoder = nn.GRU(8, 16, batch_first=True)
        self.out = nn.Linear(16, 5)

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        _, h = self.encoder(src)
        if self.detach:
            h = h.detach()  # copied from a language-model tutorial ("truncate BPTT")
        dec, _ = self.decoder(tgt_in, h)
        return self.out(dec)


def encoder_hidden_detach() -> None:
    # "seq2seq: encoder weights never change" / hidden state .detach()ed between encoder and
    # decoder / name: encoder (no gradient reaches it; cut between encoder and decoder)
    torch.manual_seed(0)
    model = Seq2Seq(detach=True)
    src, tgt_in = torch.randn(4, 6, 8), torch.randn(4, 5, 8)
    y = torch.randint(0, 5, (4, 5))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(STEPS):
        opt.zero_grad()
        loss = F.cross_entropy(model(src, tgt_in).reshape(-1, 5), y.reshape(-1))
        loss.backward()
        opt.step()
        print(f"loss {loss.item():.4f}")


class TextClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(50, 16)
        self.proj = nn.Linear(16, 16)
        self.head = nn.Linear(16, 3)

    @torch.no_grad()
    def featurize(self, tokens: torch.Tensor) -> torch.Tensor:
        # author: "this is just feature extraction, no need for grads here"
        return self.proj(self.emb(tokens)).mean(1)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.featurize(tokens)))


def nograd_helper() -> None:
    # "embeddings never learn, only the classifier" / @torch.no_grad() on a helper method the
    # forward calls / name: emb and proj (run under no_grad, no graph), only head learns
    torch.manual_seed(0)
    model = TextClassifier()
    tokens, y = torch.randint(0, 50, (8, 7)), torch.randint(0, 3, (8,))
    train(model, tokens, y)


def gan_gen_detached() -> None:
    # "GAN: generator loss moves but samples never change" / fake = G(z).detach() computed once
    # and reused for the generator step / name: G (model 'generator' never gets a gradient)
    torch.manual_seed(0)
    generator, discriminator = mlp(4, 16, 8), mlp(8, 16, 1)
    opt_g = torch.optim.Adam(generator.parameters(), lr=1e-3)
    opt_d = torch.optim.Adam(discriminator.parameters(), lr=1e-3)
    real = torch.randn(16, 8) + 2
    ones, zeros = torch.ones(16, 1), torch.zeros(16, 1)
    for _ in range(STEPS):
        fake = generator(torch.randn(16, 4)).detach()
        opt_d.zero_grad()
        d_loss = (F.binary_cross_entropy_with_logits(discriminator(real), ones)
                  + F.binary_cross_entropy_with_logits(discriminator(fake), zeros))
        d_loss.backward()
        opt_d.step()
        opt_g.zero_grad()
        g_loss = F.binary_cross_entropy_with_logits(discriminator(fake), ones)
        g_loss.backward()
        opt_g.step()
        print(f"d {d_loss.item():.4f} g {g_loss.item():.4f}")


class VAE(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.enc = mlp(8, 16)
        self.fc_mu = nn.Linear(16, 2)
        self.fc_var = nn.Linear(16, 2)
        self.dec = mlp(2, 16, 8)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        h = torch.relu(self.enc(x))
        mu, var = self.fc_mu(h), self.fc_var(h)  # raw Linear output used as a variance
        z = mu + torch.sqrt(var) * torch.randn_like(mu)
        return self.dec(z), mu, var


def vae_sqrt_var_nan() -> None:
    # "VAE loss is nan from the first batch" / variance taken from a raw Linear (can be negative),
    # then sqrt / name: fc_var (its output feeds sqrt; NaN starts right after it, before dec)
    torch.manual_seed(0)
    model = VAE()
    x = torch.randn(16, 8)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(STEPS):
        opt.zero_grad()
        recon, mu, var = model(x)
        kl = 0.5 * (var + mu ** 2 - 1 - torch.log(var)).sum(1).mean()
        loss = F.mse_loss(recon, x) + kl
        loss.backward()
        opt.step()
        print(f"loss {loss.item():.4f}")


def sqrt_pairwise_nan() -> None:
    # "contrastive loss: weights become NaN after the first step, loss was finite" / pairwise
    # distance via sqrt of squared distances: d/dx sqrt at 0 (the diagonal) is inf -> NaN grad /
    # name: embedder (backward NaN enters at its output from the loss, forward finite)
    torch.manual_seed(0)
    embedder = mlp(8, 16, 4)
    x, labels = torch.randn(12, 8), torch.randint(0, 3, (12,))
    same = (labels[:, None] == labels[None]).float()
    opt = torch.optim.SGD(embedder.parameters(), lr=0.05)
    for _ in range(STEPS):
        opt.zero_grad()
        e = embedder(x)
        d = ((e[:, None] - e[None]) ** 2).sum(-1).sqrt()
        loss = (same * d ** 2 + (1 - same) * F.relu(1 - d) ** 2).mean()
        loss.backward()
        opt.step()
        print(f"loss {loss.item():.4f}")


class ListCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        # plain list: the blocks are not registered, model.parameters() misses them
        self.blocks = [nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.ReLU()) for _ in range(2)]
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.stem(x))
        for block in self.blocks:
            x = block(x)
        return self.head(x.mean((2, 3)))


def python_list_layers() -> None:
    # "CNN: adding more blocks changes nothing, their weights stay the same" / blocks kept in a
    # python list instead of nn.ModuleList: not in parameters(), not optimized, not in state_dict /
    # name: the blocks (unregistered submodules, their gradients accumulate but are never stepped)
    torch.manual_seed(0)
    model = ListCNN()
    x, y = torch.randn(4, 3, 8, 8), torch.randint(0, 4, (4,))
    train(model, x, y, lr=0.05)


class TinyTransformer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(30, 16)
        # meant to be a learned positional embedding
        self.register_buffer("pos", torch.zeros(1, 10, 16))
        self.layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        self.head = nn.Linear(16, 3)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok(tokens) + self.pos[:, : tokens.shape[1]]
        return self.head(self.layer(h).mean(1))


def pos_emb_buffer() -> None:
    # "transformer ignores word order; positional embedding stays all zeros" / learnable positional
    # embedding registered with register_buffer / name: the model's 'pos' buffer (zeros, never
    # updated; should be an nn.Parameter)
    torch.manual_seed(0)
    model = TinyTransformer()
    tokens, y = torch.randint(0, 30, (8, 10)), torch.randint(0, 3, (8,))
    train(model, tokens, y, lr=0.05)


def init_zeros() -> None:
    # "loss stuck at log(3), every layer except the last bias has zero gradient" / custom init
    # with nn.init.zeros_ on every Linear weight (symmetry + dead ReLU path) / name: 0, 2, 4 (all
    # Linear weights zero: zero activations, zero gradients)
    torch.manual_seed(0)
    model = mlp(8, 32, 32, 3)

    def init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.zeros_(m.weight)
            nn.init.zeros_(m.bias)

    model.apply(init)
    x, y = batch()
    train(model, x, y)


class BackboneHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.backbone = mlp(8, 32, 32)
        self.head = nn.Linear(32, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.backbone(x)))


def param_group_forgot_head() -> None:
    # "fine-tuning: the new classifier head never changes" / optimizer param groups list only the
    # backbone (the head's group was forgotten) / name: head (has gradients, weights never update)
    torch.manual_seed(0)
    model = BackboneHead()
    opt = torch.optim.SGD([{"params": model.backbone.parameters(), "lr": 0.05}], lr=0.1)
    x, y = batch()
    train(model, x, y, optimizer=opt)


def double_softmax_ce() -> None:
    # "accuracy stuck, loss barely moves" / nn.Softmax at the end of the model, then
    # nn.CrossEntropyLoss (softmax applied twice, gradients squashed) / name: the final
    # nn.Softmax (model.3) in front of cross_entropy
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 10), nn.Softmax(dim=1))
    x, y = batch(classes=10)
    train(model, x, y, loss_fn=nn.CrossEntropyLoss())


def mse_broadcast() -> None:
    # "regression loss plateaus at the variance of y" / pred (B, 1) vs target (B,) broadcasts to
    # (B, B) in MSELoss / name: the model output shape (head '2') vs the target, the loss
    torch.manual_seed(0)
    model = mlp(8, 32, 1)
    x = torch.randn(16, 8)
    y = x[:, 0] * 2 + 1
    train(model, x, y, loss_fn=nn.MSELoss(), lr=0.01)


class ClampRegressor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = mlp(64, 32)
        self.out = nn.Linear(32, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.body(x))).clamp(0, 1)  # "keep it a probability"


def clamp_saturated() -> None:
    # "loss never changes, all gradients zero" / prediction clamped to [0, 1] while raw pixel
    # inputs (0..255) push nearly every output outside: clamp's gradient is 0 / name: out (its
    # output gradient is zero because of the clamp after it; un-normalized input)
    torch.manual_seed(0)
    model = ClampRegressor()
    x = torch.randint(0, 256, (16, 64)).float()
    y = torch.rand(16, 1)
    train(model, x, y, loss_fn=F.mse_loss, lr=1e-4)


# ---------------------------------------------------------------- healthy look-alikes


def ok_gan() -> None:
    # correct GAN step: fake.detach() only for the discriminator step, G step backprops through D
    torch.manual_seed(0)
    generator, discriminator = mlp(4, 16, 8), mlp(8, 16, 1)
    opt_g = torch.optim.Adam(generator.parameters(), lr=1e-3)
    opt_d = torch.optim.Adam(discriminator.parameters(), lr=1e-3)
    real = torch.randn(16, 8) + 2
    ones, zeros = torch.ones(16, 1), torch.zeros(16, 1)
    for _ in range(STEPS):
        fake = generator(torch.randn(16, 4))
        opt_d.zero_grad()
        d_loss = (F.binary_cross_entropy_with_logits(discriminator(real), ones)
                  + F.binary_cross_entropy_with_logits(discriminator(fake.detach()), zeros))
        d_loss.backward()
        opt_d.step()
        opt_g.zero_grad()
        g_loss = F.binary_cross_entropy_with_logits(discriminator(fake), ones)
        g_loss.backward()
        opt_g.step()
        print(f"d {d_loss.item():.4f} g {g_loss.item():.4f}")


def ok_frozen_backbone() -> None:
    # deliberate freeze: backbone requires_grad_(False) + eval(), optimizer over the head only
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))
    backbone = model[:5]
    backbone.requires_grad_(False)
    x, y = torch.randn(4, 3, 8, 8), torch.randint(0, 4, (4,))
    opt = torch.optim.SGD(model[5].parameters(), lr=0.05)
    model.train()
    backbone.eval()
    train(model, x, y, optimizer=opt)


class TiedLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(40, 16)
        self.rnn = nn.LSTM(16, 16, batch_first=True)
        self.out = nn.Linear(16, 40)
        self.out.weight = self.emb.weight  # weight tying on purpose

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h, _ = self.rnn(self.emb(tokens))
        return self.out(h)


def ok_tied_weights() -> None:
    # intentional weight tying (output layer shares the embedding matrix), LSTM LM
    torch.manual_seed(0)
    model = TiedLM()
    tokens = torch.randint(0, 40, (4, 9))
    train(model, tokens[:, :-1], tokens[:, 1:],
          loss_fn=lambda logits, y: F.cross_entropy(logits.reshape(-1, 40), y.reshape(-1)))


def ok_eval_nograd() -> None:
    # train steps interleaved with a validation pass under model.eval() + torch.no_grad()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.3),
                          nn.Linear(32, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = batch()
    xv, yv = batch(8)
    for _ in range(STEPS):
        model.train()
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        model.eval()
        with torch.no_grad():
            val = F.cross_entropy(model(xv), yv)
        print(f"loss {loss.item():.4f} val {val.item():.4f}")


def ok_target_net() -> None:
    # DQN: the target network is evaluated under no_grad and soft-updated through .data
    torch.manual_seed(0)
    q, target = mlp(6, 32, 4), mlp(6, 32, 4)
    target.load_state_dict(q.state_dict())
    target.requires_grad_(False)
    opt = torch.optim.Adam(q.parameters(), lr=1e-3)
    s, s2 = torch.randn(16, 6), torch.randn(16, 6)
    a, r = torch.randint(0, 4, (16,)), torch.randn(16)
    for _ in range(STEPS):
        with torch.no_grad():
            tgt = r + 0.99 * target(s2).max(1).values
        pred = q(s).gather(1, a[:, None]).squeeze(1)
        loss = F.smooth_l1_loss(pred, tgt)
        opt.zero_grad()
        loss.backward()
        opt.step()
        for tp, p in zip(target.parameters(), q.parameters(), strict=True):
            tp.data.mul_(0.99).add_(0.01 * p.data)
        print(f"loss {loss.item():.4f}")


CASES: dict[str, Callable[[], None]] = {f.__name__: f for f in (
    encoder_hidden_detach, nograd_helper, gan_gen_detached, vae_sqrt_var_nan, sqrt_pairwise_nan,
    python_list_layers, pos_emb_buffer, init_zeros, param_group_forgot_head, double_softmax_ce,
    mse_broadcast, clamp_saturated,
    ok_gan, ok_frozen_backbone, ok_tied_weights, ok_eval_nograd, ok_target_net,
)}

if __name__ == "__main__":
    CASES[sys.argv[1]]()
