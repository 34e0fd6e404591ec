"""Fourth blind set (issue 26): bugs in what the optimizer sees versus what the model is, in mixed
precision and gradient scaling, and in losses and sampling written as functions, written without
reading the check code; one per CASE (argv[1]), and healthy look-alikes (``ok_*``) that must stay
silent. Above each case: the thread it comes from; in it: the symptom / the real cause / what a
good debugger should name. Each case trains a tiny seeded model on CPU for a few steps and prints
the number that shows the bug (a weight that never moves, an update 65536x too large, ...)."""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable

import torch
from torch import nn
from torch.distributions import Categorical, Normal
from torch.nn import functional as F
from torch.nn.utils import parametrizations
from torch.utils.checkpoint import checkpoint

torch.set_num_threads(1)
STEPS = 4


def mlp(*sizes: int, act: type[nn.Module] = nn.ReLU) -> nn.Sequential:
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(sizes):
        layers += [nn.Linear(a, b), act()]
    return nn.Sequential(*layers[:-1])


def batch(n: int = 16, features: int = 8, classes: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(n, features), torch.randint(0, classes, (n,))


def moved(before: torch.Tensor, after: torch.Tensor) -> float:
    """How far a weight moved, relative to its norm."""
    return ((after.detach().float() - before.float()).norm() / before.float().norm()).item()


def fit(model: nn.Module, x: torch.Tensor, y: torch.Tensor, opt: torch.optim.Optimizer,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = F.cross_entropy,
        steps: int = STEPS) -> None:
    for _ in range(steps):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        print(f"loss {loss.item():.4f}")


# ============================================================ the optimizer versus the model


class ListBlocksCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        # "a list of residual blocks": a plain Python list, so nn.Module never registers them
        self.blocks = [nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.ReLU()) for _ in range(2)]
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.stem(x))
        for block in self.blocks:
            x = x + block(x)
        return self.head(x.mean((2, 3)))


# https://www.engineermaxxing.com/micro/lessons/pytorch-internals.html (layers in a plain list)
def list_blocks() -> None:
    # "residual blocks never change" / blocks kept in a Python list: model.parameters() and so
    # the optimizer miss them; they get gradients every step / name: blocks.0.0, blocks.1.0
    torch.manual_seed(0)
    model = ListBlocksCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 3, 8, 8), torch.randint(0, 4, (8,))
    w0 = model.blocks[0][0].weight.detach().clone()
    fit(model, x, y, opt)
    print(f"blocks[0] conv moved {moved(w0, model.blocks[0][0].weight):.2e} (bug: 0)")


class FlattenInForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.MaxPool2d(2))
        self.fc: nn.Linear | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x).flatten(1)
        # "so I don't have to work out the flattened size": a new, random head at every call
        self.fc = nn.Linear(x.shape[1], 10)
        return self.fc(x)


# https://thecodeforge.io/ml-ai/pytorch-neural-network/ (layers defined inside forward())
def layer_in_forward() -> None:
    # "loss does not go down, accuracy stays at chance" / nn.Linear created in forward at every
    # call: a fresh random fc each step, never in the optimizer / name: fc (re-created each call)
    torch.manual_seed(0)
    model = FlattenInForward()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 1, 10, 10), torch.randint(0, 10, (16,))
    fcs = []
    for _ in range(STEPS):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        fcs.append(id(model.fc))
        print(f"loss {loss.item():.4f}")
    print(f"distinct fc objects over {STEPS} steps: {len(set(fcs))} (bug: {STEPS})")


class SmallCNN(nn.Module):
    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(),
                                      nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(8, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x))


# https://theneuralbase.com/pytorch/learn/intermediate/replacing-the-classification-head/
# ("replace head before DataParallel/DistributedDataParallel wrapping")
def head_on_wrapper() -> None:
    # "fine-tuning to 3 classes, the new head never learns, outputs still have 10 columns" /
    # model.fc = Linear(8, 3) set on the DataParallel wrapper, not on model.module: the wrapper's
    # forward calls module.fc, the old 10-class head / name: fc on the wrapper, never called
    torch.manual_seed(0)
    net = SmallCNN(classes=10)  # stands for a pretrained 10-class network
    model = nn.DataParallel(net)  # no GPU here: it calls net directly
    model.fc = nn.Linear(8, 3)  # meant model.module.fc
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 3, 8, 8), torch.randint(0, 3, (8,))
    w0 = model.fc.weight.detach().clone()
    for _ in range(STEPS):
        opt.zero_grad()
        out = model(x)
        loss = F.cross_entropy(out, y)
        loss.backward()
        opt.step()
        print(f"loss {loss.item():.4f} logits {tuple(out.shape)}")
    print(f"new head moved {moved(w0, model.fc.weight):.2e}, grad {model.fc.weight.grad} (bug: 0)")


class TinyLM(nn.Module):
    def __init__(self, vocab: int = 40, dim: int = 16, tie: str = "") -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.rnn = nn.GRU(dim, dim, batch_first=True)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        if tie == "data":
            # two Parameters over one storage: both in model.parameters(), both stepped
            self.lm_head.weight.data = self.embed.weight.data
        elif tie == "param":
            self.lm_head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h, _ = self.rnn(self.embed(tokens))
        return self.lm_head(h)


def lm_steps(model: TinyLM, steps: int = STEPS) -> float:
    """Train with Adam on a fixed batch; the relative move of the embedding at the first step."""
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 40, (4, 9), generator=gen)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    first = 0.0
    for i in range(steps):
        w0 = model.embed.weight.detach().clone()
        opt.zero_grad()
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, 40), tokens[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        if i == 0:
            first = (model.embed.weight.detach() - w0).norm().item()
        print(f"loss {loss.item():.4f}")
    return first


# https://ai.stackexchange.com/questions/45005 (how to share the embedding and output matrix)
def tied_by_data() -> None:
    # "tied LM diverges / state_dict has two copies" / lm_head.weight.data = embed.weight.data:
    # two Parameters share storage and Adam steps each with half of the gradient, about twice
    # the step / name: lm_head and embed share storage as two parameters of the optimizer
    torch.manual_seed(0)
    model = TinyLM(tie="data")
    n = len(list(model.parameters()))
    step = lm_steps(model)
    # tied right (ok_tied_assign): 5 parameters, first update 2.53e-01 (1.29x smaller)
    print(f"{n} parameters; first update of the shared matrix {step:.3e}")


# https://pytorch.org/docs/stable/generated/torch.nn.utils.parametrizations.weight_norm.html
# (the parametrization registers new parameters original0/original1 in place of weight)
def weight_norm_after_opt() -> None:
    # "added weight norm and the last layer stopped learning" / parametrizations.weight_norm
    # applied after the optimizer was built: original0/original1 are new Parameters that no
    # optimizer holds; the optimizer holds the old weight, which nothing uses / name: model.2
    torch.manual_seed(0)
    model = mlp(8, 32, 3)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    parametrizations.weight_norm(model[2])  # "stabilise the classifier", added later in setup
    x, y = batch()
    v0 = model[2].parametrizations.weight.original1.detach().clone()
    w0 = model[0].weight.detach().clone()
    fit(model, x, y, opt)
    print(f"weight-normed layer moved {moved(v0, model[2].parametrizations.weight.original1):.2e}"
          f" (bug: 0); first layer moved {moved(w0, model[0].weight):.2e}")


# https://tarepan.hatenablog.com/entry/2020/10/22/143519 (two optimizers, two steps per iteration)
def two_opts_one_twice() -> None:
    # "autoencoder: the decoder never improves" / copy-paste: opt_enc.step() twice, opt_dec never
    # / name: the decoder (its optimizer never steps), the encoder stepped twice per backward
    torch.manual_seed(0)
    encoder, decoder = mlp(16, 32, 4), mlp(4, 32, 16)
    opt_enc = torch.optim.Adam(encoder.parameters(), lr=1e-2)
    opt_dec = torch.optim.Adam(decoder.parameters(), lr=1e-2)
    x = torch.randn(32, 16)
    d0 = decoder[0].weight.detach().clone()
    for _ in range(STEPS):
        opt_enc.zero_grad()
        opt_dec.zero_grad()
        loss = F.mse_loss(decoder(encoder(x)), x)
        loss.backward()
        opt_enc.step()
        opt_enc.step()  # meant opt_dec.step()
        print(f"loss {loss.item():.4f}")
    print(f"decoder moved {moved(d0, decoder[0].weight):.2e} (bug: 0)")


# https://errorcanon.top/errors/pytorch/optimizer-step-without-loss-backward/index.md
def step_before_backward() -> None:
    # "loss never changes" / zero_grad(); forward; optimizer.step(); loss.backward(): every step
    # sees the gradients cleared (None) and does nothing; backward's gradients are cleared next
    # iteration / name: the model's optimizer steps with no gradient (before the backward)
    torch.manual_seed(0)
    model = mlp(8, 32, 32, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = batch()
    w0 = model[0].weight.detach().clone()
    for _ in range(STEPS):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        opt.step()
        loss.backward()
        print(f"loss {loss.item():.4f}")
    print(f"first layer moved {moved(w0, model[0].weight):.2e} (bug: 0)")


# https://thecodeforge.io/ml-ai/pytorch-training-loop/ (missing zero_grad)
def no_zero_grad() -> None:
    # "loss goes down then blows up" / optimizer.zero_grad() never called: step t applies the
    # sum of every gradient so far / name: gradients carried over, the model's optimizer
    torch.manual_seed(0)
    model = mlp(8, 32, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    x, y = batch()
    for _ in range(STEPS + 1):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        print(f"loss {loss.item():.4f} grad {model[0].weight.grad.norm().item():.3f}")


# ============================================================ mixed precision and scaling


def amp_data() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    return mlp(16, 64, 64, 4), torch.randn(32, 16), torch.randint(0, 4, (32,))


def autocast16() -> torch.autocast:
    return torch.autocast("cpu", dtype=torch.float16)


# https://github.com/nerfstudio-project/nerfacc/issues/307 (GradScaler used for scaling only)
def optimizer_step_not_scaler() -> None:
    # "AMP: loss NaN after a few steps" / scaler.scale(loss).backward(); optimizer.step(): the
    # gradients are never unscaled, SGD applies them 65536x too large / name: the model's
    # optimizer steps the scaled gradients (no scaler.step / unscale_)
    model, x, y = amp_data()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu")
    for _ in range(STEPS):
        w0 = model[0].weight.detach().clone()
        opt.zero_grad()
        with autocast16():
            loss = F.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        opt.step()  # meant scaler.step(opt); scaler.update()
        print(f"loss {loss.item():.4f} first layer moved {moved(w0, model[0].weight):.2e} "
              f"(unscaled: ~1e-3)")


# https://pytorch.org/docs/stable/notes/amp_examples.html#gradient-clipping
def clip_before_unscale() -> None:
    # "AMP training does not learn" / clip_grad_norm_(max_norm=1) on the scaled gradients, then
    # scaler.step unscales them: the update is 1/65536 of a clipped one / name: the clipping
    # before unscale_ (gradients far below the model's gradients)
    model, x, y = amp_data()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    w0 = model[0].weight.detach().clone()
    for _ in range(STEPS):
        opt.zero_grad()
        with autocast16():
            loss = F.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # meant after scaler.unscale_(opt)
        scaler.step(opt)
        scaler.update()
        print(f"loss {loss.item():.4f} scale {scaler.get_scale():.0f}")
    print(f"first layer moved {moved(w0, model[0].weight):.2e} (healthy: ~1e-2)")


# https://www.workatafrontierlab.com/lessons/foundations/numerical-stability
# ("small gradients underflow to exactly zero in FP16, and layers stop learning")
def fp16_underflow() -> None:
    # "model.half(): loss never moves, grads are all 0.0" / pure float16 weights and activations,
    # no loss scaling: the pixel loss, weighted 1e-4 and averaged over 24576 pixels, gives each
    # pixel a gradient below 6e-8, exactly 0 in float16 (not in float32) / name: the model's
    # gradients underflow to zero in float16 (no GradScaler)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(),
                          nn.Conv2d(8, 3, 3, padding=1))
    # the same model and batch in float32: first conv's gradient norm 3.0e-05, not 0
    model, x = model.half(), torch.rand(8, 3, 32, 32).half()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    w0 = model[0].weight.detach().clone()
    for _ in range(STEPS):
        opt.zero_grad()
        loss = 1e-4 * F.mse_loss(model(x), x)  # "pixel-loss weight 1e-4 from the recipe"
        loss.backward()
        opt.step()
        g = torch.cat([p.grad.flatten() for p in model.parameters()]).float()
        print(f"loss {loss.item():.3e} grad nonzero {(g != 0).float().mean().item():.3f}")
    print(f"first conv moved {moved(w0, model[0].weight):.2e} (bug: 0)")


# https://discuss.pytorch.org/t/adam-half-precision-nans/1765
def adam_eps_fp16() -> None:
    # "Adam + half = NaN" / float16 weights with Adam's eps=1e-8, which is 0 in float16: where
    # grad^2 underflows, the update is m / 0 = inf / name: the Adam optimizer of a float16 model
    torch.manual_seed(0)
    model = mlp(16, 64, 64, 1).half()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(64, 16).half()
    y = torch.randn(64, 1).half() * 0.01
    for _ in range(STEPS):
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        w = model[0].weight
        print(f"loss {loss.item():.4f} weight nonfinite {(~w.isfinite()).sum().item()}")


# https://discuss.pytorch.org/t/pytorch-gradient-accumulation/55955
def accum_no_divide() -> None:
    # "accumulating 4 micro-batches trains worse than batch 64" / loss.backward() on each
    # micro-batch's mean loss without / k: the update is k times the large batch's / name: the
    # model's optimizer, gradients summed over 4 backwards without the 1/4
    torch.manual_seed(0)
    model = mlp(8, 32, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = batch(64)
    k = 4
    for _ in range(STEPS):
        opt.zero_grad()
        for xb, yb in zip(x.chunk(k), y.chunk(k), strict=True):
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()  # meant (loss / k).backward()
        # against the gradient of the whole batch of 64: 4.00x
        print(f"loss {loss.item():.4f} grad {model[0].weight.grad.norm().item():.4f}")
        opt.step()


def scaled_loss(scaler: torch.amp.GradScaler, model: nn.Module, x: torch.Tensor,
                y: torch.Tensor) -> torch.Tensor:
    """A helper from a refactor that already scales the loss."""
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = F.cross_entropy(model(x), y)
    return scaler.scale(loss)


# https://github.com/pytorch/pytorch/pull/26512 (gradient scaling API: scale once, step, update)
def scale_twice() -> None:
    # "loss explodes after switching to AMP" / the helper returns scaler.scale(loss) and the loop
    # scales it again: gradients x S^2, unscaled by S, SGD updates 65536x too large / name: the
    # loss scaled twice (the model's gradients S times too large after unscale)
    model, x, y = amp_data()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu")
    for _ in range(STEPS):
        w0 = model[0].weight.detach().clone()
        opt.zero_grad()
        loss = scaled_loss(scaler, model, x, y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        print(f"scaled loss {loss.item():.1f} first layer moved "
              f"{moved(w0, model[0].weight):.2e} (fp32: ~1e-2)")


# https://ayushgarg.ca/notes/Mixed-Precision-Training ("updates become too small to be
# represented in FP16": no fp32 master weights)
def bf16_weights_stall() -> None:
    # "model.to(torch.bfloat16): loss flat" / bfloat16 weights and a small learning rate: every
    # lr * grad is below half a bfloat16 ulp of the weight, rounding gives the weight back /
    # name: the model's weights (bfloat16, no fp32 master copy) do not change
    torch.manual_seed(0)
    model = mlp(16, 64, 4).to(torch.bfloat16)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x, y = torch.randn(32, 16).to(torch.bfloat16), torch.randint(0, 4, (32,))
    w0 = model[0].weight.detach().clone()
    fit(model, x, y, opt, steps=STEPS + 1)
    changed = (model[0].weight != w0).float().mean().item()
    print(f"first layer: {changed:.3f} of its elements changed (bug: 0)")


# ============================================================ losses and sampling as functions


# https://openillumi.com/?p=73112 (nn.CrossEntropyLoss fed probabilities)
def ce_on_softmax() -> None:
    # "loss stuck near log(C) - 0.x, slow to learn" / F.cross_entropy(F.softmax(logits)): the
    # loss softmaxes probabilities again, gradients squashed / name: the softmax before the loss
    torch.manual_seed(0)
    model = mlp(8, 32, 5)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    x, y = batch(classes=5)
    fit(model, x, y, opt, loss_fn=lambda out, t: F.cross_entropy(F.softmax(out, dim=1), t))


class TwoHeads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.trunk = mlp(8, 32, 32)
        self.main_head = nn.Linear(32, 3)
        self.aux_head = nn.Linear(32, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = F.relu(self.trunk(x))
        return self.main_head(h), self.aux_head(h)


# https://datascience.stackexchange.com/questions/61024 (auxiliary losses added to the total)
def aux_loss_item() -> None:
    # "auxiliary head never learns" / total = main + 0.4 * aux_loss.item(): the aux term is a
    # Python float, no gradient / name: aux_head (its output gets no gradient back)
    torch.manual_seed(0)
    model = TwoHeads()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = batch()
    aux_y = torch.randn(16, 1)
    a0 = model.aux_head.weight.detach().clone()
    for _ in range(STEPS):
        opt.zero_grad()
        main, aux = model(x)
        aux_loss = F.mse_loss(aux, aux_y)
        loss = F.cross_entropy(main, y) + 0.4 * aux_loss.item()  # "logged" value reused
        loss.backward()
        opt.step()
        print(f"loss {loss.item():.4f} aux {aux_loss.item():.4f}")
    print(f"aux head moved {moved(a0, model.aux_head.weight):.2e} (bug: 0)")


class VAE(nn.Module):
    def __init__(self, rsample: bool) -> None:
        super().__init__()
        self.rsample = rsample
        self.enc = mlp(16, 32, 8)
        self.dec = mlp(4, 32, 16)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        mu, logvar = self.enc(x).chunk(2, dim=1)
        q = Normal(mu, (0.5 * logvar).exp())
        z = q.rsample() if self.rsample else q.sample()
        return self.dec(z), mu, logvar


def vae_run(rsample: bool) -> None:
    torch.manual_seed(0)
    model = VAE(rsample)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    x = torch.randn(32, 16)
    for _ in range(STEPS):
        opt.zero_grad()
        recon, mu, logvar = model(x)
        rec = F.mse_loss(recon, x, reduction="sum") / len(x)
        kl = -0.5 * (1 + logvar - mu.pow(2) - logvar.exp()).sum(1).mean()
        (rec + kl).backward()
        opt.step()
        # the encoder's gradient from the reconstruction term alone (autograd.grad of rec):
        # 0 with sample(), about 1.0 with rsample()
        print(f"rec {rec.item():.3f} kl {kl.item():.3f} "
              f"encoder grad {model.enc[0].weight.grad.norm().item():.3e}")


# https://stackoverflow.com/questions/60533150 (what is the difference between sample() and
# rsample()?)
def vae_sample() -> None:
    # "VAE: the latent ignores the input, reconstructions are all the mean" / z = q.sample(): no
    # reparameterisation, the encoder only gets the KL gradient / name: the sampling in forward
    # (the decoder's input gets no gradient back to enc)
    vae_run(rsample=False)


class SeqClassifier(nn.Module):
    def __init__(self, batch_first: bool) -> None:
        super().__init__()
        self.lstm = nn.LSTM(6, 16, batch_first=batch_first)
        self.head = nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)
        return self.head(out[:, -1, :])  # "last time step", written for (batch, seq, feat)


# https://discuss.pytorch.org/t/lstm-change-batch-first-true-loss-does-not-decrease/62364
def lstm_no_batch_first() -> None:
    # "LSTM classifier stuck at chance" / (batch=16, seq=10, 6) fed to an LSTM without
    # batch_first: it runs 16 time steps over a batch of 10, and out[:, -1] is the last sample's
    # sequence, not each sample's last step / name: lstm (its input's first dim is the batch)
    torch.manual_seed(0)
    model = SeqClassifier(batch_first=False)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    x = torch.randn(16, 10, 6)
    y = (x[:, :, 0].mean(1) > 0).long()
    fit(model, x, y, opt, steps=STEPS + 2)


class Policy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = mlp(4, 32, 2, act=nn.Tanh)

    def forward(self, s: torch.Tensor) -> Categorical:
        return Categorical(logits=self.net(s))


def rollout(policy: Policy, gen: torch.Generator) -> tuple[list[torch.Tensor], torch.Tensor]:
    """One episode of a toy task (reward 1 for action 0 when the first feature is positive)."""
    log_probs, rewards = [], []
    for _ in range(8):
        s = torch.randn(4, generator=gen)
        dist = policy(s)
        a = dist.sample()
        log_probs.append(dist.log_prob(a))
        rewards.append(float((a.item() == 0) == (s[0].item() > 0)))
    returns = torch.tensor(rewards).flip(0).cumsum(0).flip(0)
    return log_probs, (returns - returns.mean()) / (returns.std() + 1e-6)


# https://huggingface.co/datasets/nvidia/Nemotron-CC-Math-v1 ("Simple Policy Gradient
# Application - Wrong Learning", discuss.pytorch.org, reinforcement-learning category)
def pg_tensor_logprobs() -> None:
    # "REINFORCE: policy never changes" / loss from torch.tensor(log_probs, requires_grad=True):
    # a new leaf made from the numbers, the policy's graph is dropped / name: the policy (never
    # reached by backward; the loss's leaf is not its output)
    torch.manual_seed(0)
    policy = Policy()
    opt = torch.optim.Adam(policy.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(0)
    w0 = policy.net[0].weight.detach().clone()
    for _ in range(STEPS):
        log_probs, returns = rollout(policy, gen)
        # "backward complained that element 0 does not require grad", so requires_grad=True
        loss = -(torch.tensor(log_probs, requires_grad=True) * returns).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"loss {loss.item():.4f}")
    print(f"policy moved {moved(w0, policy.net[0].weight):.2e} (bug: 0)")


# https://runebook.dev/en/docs/pytorch/generated/torch.nn.nllloss/torch.nn.NLLLoss
# ("NLLLoss does not take the raw outputs (logits)")
def nll_on_logits() -> None:
    # "loss goes negative and keeps falling" / F.nll_loss on raw logits: -mean(logit[y]) is
    # unbounded, the logits just grow / name: the loss's input (logits, no log_softmax)
    torch.manual_seed(0)
    model = mlp(8, 32, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = batch(classes=4)
    fit(model, x, y, opt, loss_fn=F.nll_loss, steps=STEPS + 1)


class ProbClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = mlp(8, 32, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.body(x))  # "return probabilities, handy at inference"


# https://runebook.dev/ru/docs/pytorch/generated/torch.nn.bcewithlogitsloss (sigmoid applied
# twice: the model "will not move")
def bce_logits_on_sigmoid() -> None:
    # "binary classifier: loss stuck near 0.6-0.7" / the model returns sigmoid(x) and the loss
    # is binary_cross_entropy_with_logits: sigmoid twice, predictions stuck in (0.5, 0.73) /
    # name: the sigmoid before a with-logits loss
    torch.manual_seed(0)
    model = ProbClassifier()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    x = torch.randn(32, 8)
    y = (x[:, :1] > 0).float()
    fit(model, x, y, opt, loss_fn=F.binary_cross_entropy_with_logits, steps=STEPS + 1)


# ============================================================ healthy look-alikes


def ok_scaler_skips() -> None:
    # GradScaler starting at a scale too large for float16: the first steps' gradients are inf,
    # it skips them and halves its scale, then trains (as it is meant to)
    model, x, y = amp_data()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 20)
    for _ in range(STEPS + 2):
        opt.zero_grad()
        with autocast16():
            loss = F.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        print(f"loss {loss.item():.4f} scale {scaler.get_scale():.0f}")


def ok_accum_divided() -> None:
    torch.manual_seed(0)
    model = mlp(8, 32, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = batch(64)
    k = 4
    for _ in range(STEPS):
        opt.zero_grad()
        for xb, yb in zip(x.chunk(k), y.chunk(k), strict=True):
            loss = F.cross_entropy(model(xb), yb) / k
            loss.backward()
        opt.step()
        print(f"loss {loss.item() * k:.4f}")


def ok_tied_assign() -> None:
    torch.manual_seed(0)
    lm_steps(TinyLM(tie="param"))


class CheckpointedNet(nn.Module):
    def __init__(self, reentrant: bool) -> None:
        super().__init__()
        self.reentrant = reentrant
        self.stem = nn.Linear(8, 32)
        self.block = nn.Sequential(nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 32))
        self.head = nn.Linear(32, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.stem(x))
        h = h + checkpoint(self.block, h, use_reentrant=self.reentrant)
        return self.head(h)


def ok_checkpoint_reentrant() -> None:
    torch.manual_seed(0)
    model = CheckpointedNet(reentrant=True)
    x, y = batch()
    fit(model, x, y, torch.optim.SGD(model.parameters(), lr=0.1))


def ok_checkpoint_nonreentrant() -> None:
    torch.manual_seed(0)
    model = CheckpointedNet(reentrant=False)
    x, y = batch()
    fit(model, x, y, torch.optim.SGD(model.parameters(), lr=0.1))


def ok_unscale_clip_step() -> None:
    model, x, y = amp_data()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    for _ in range(STEPS):
        opt.zero_grad()
        with autocast16():
            loss = F.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        print(f"loss {loss.item():.4f}")


def ok_bf16_autocast() -> None:
    model, x, y = amp_data()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(STEPS):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        print(f"loss {loss.item():.4f}")


def ok_vae_rsample() -> None:
    vae_run(rsample=True)


def ok_lstm_batch_first() -> None:
    torch.manual_seed(0)
    model = SeqClassifier(batch_first=True)
    x = torch.randn(16, 10, 6)
    y = (x[:, :, 0].mean(1) > 0).long()
    fit(model, x, y, torch.optim.Adam(model.parameters(), lr=1e-2))


class SeqFirstClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(6, 16)
        self.head = nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)  # x: (seq, batch, feat)
        return self.head(out[-1])


def ok_lstm_seq_first() -> None:
    torch.manual_seed(0)
    model = SeqFirstClassifier()
    x = torch.randn(10, 16, 6)
    y = (x[:, :, 0].mean(0) > 0).long()
    fit(model, x, y, torch.optim.Adam(model.parameters(), lr=1e-2))


def ok_reinforce_stack() -> None:
    torch.manual_seed(0)
    policy = Policy()
    opt = torch.optim.Adam(policy.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(0)
    for _ in range(STEPS):
        log_probs, returns = rollout(policy, gen)
        loss = -(torch.stack(log_probs) * returns).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"loss {loss.item():.4f}")


class ModuleListCNN(ListBlocksCNN):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(self.blocks)


def ok_modulelist() -> None:
    torch.manual_seed(0)
    model = ModuleListCNN()
    x, y = torch.randn(8, 3, 8, 8), torch.randint(0, 4, (8,))
    fit(model, x, y, torch.optim.SGD(model.parameters(), lr=0.1))


def ok_parametrize_before_opt() -> None:
    torch.manual_seed(0)
    model = mlp(8, 32, 3)
    parametrizations.weight_norm(model[2])
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    x, y = batch()
    fit(model, x, y, opt)


def ok_gan_two_opts() -> None:
    torch.manual_seed(0)
    generator, discriminator = mlp(4, 32, 8), mlp(8, 32, 1)
    opt_g = torch.optim.Adam(generator.parameters(), lr=1e-3, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(discriminator.parameters(), lr=1e-3, betas=(0.5, 0.999))
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


def ok_ce_on_logits() -> None:
    torch.manual_seed(0)
    model = mlp(8, 32, 5)
    x, y = batch(classes=5)
    fit(model, x, y, torch.optim.SGD(model.parameters(), lr=0.5))


BUGS: tuple[Callable[[], None], ...] = (
    list_blocks, layer_in_forward, head_on_wrapper, tied_by_data, weight_norm_after_opt,
    two_opts_one_twice, step_before_backward, no_zero_grad,
    optimizer_step_not_scaler, clip_before_unscale, fp16_underflow, adam_eps_fp16,
    accum_no_divide, scale_twice, bf16_weights_stall,
    ce_on_softmax, aux_loss_item, vae_sample, lstm_no_batch_first, pg_tensor_logprobs,
    nll_on_logits, bce_logits_on_sigmoid,
)
HEALTHY: tuple[Callable[[], None], ...] = (
    ok_scaler_skips, ok_accum_divided, ok_tied_assign, ok_checkpoint_reentrant,
    ok_checkpoint_nonreentrant, ok_unscale_clip_step, ok_bf16_autocast, ok_vae_rsample,
    ok_lstm_batch_first, ok_lstm_seq_first, ok_reinforce_stack, ok_modulelist,
    ok_parametrize_before_opt, ok_gan_two_opts, ok_ce_on_logits,
)
CASES: dict[str, Callable[[], None]] = {f.__name__: f for f in (*BUGS, *HEALTHY)}

if __name__ == "__main__":
    CASES[sys.argv[1]]()
