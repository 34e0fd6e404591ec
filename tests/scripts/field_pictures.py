"""Field programs for the pictures (issue 38, items 5 and 7): the shapes real training programs
have that a picture must draw as they are; one per CASE (argv[1]). Each trains a tiny seeded
model on CPU for a few steps and is healthy: ``check`` must stay silent on them.

- ``lstm``: a module returning ``(out, (h, c))`` as ``nn.LSTM`` does, the consumer using ``out``
  only: the consumer is joined to ``out``'s maker, not to the LSTM that made ``h`` and ``c``.
- ``two_parents``: one block registered under two parents (an encoder and a decoder sharing it):
  each call is drawn inside the parent that called it.
- ``wrapped``: BYOL's backbone, registered on the learner and inside the wrapper that alone
  calls it: drawn inside the wrapper, with its layers.
- ``made_in_forward``: layers built inside ``forward`` (a lazily made head and an encoder's
  ``Sequential``, registered there): named by the attribute they are registered under.
- ``gru``: makemore's GRU: a cell of three Linear layers unrolled over 16 characters from a
  hidden state that starts at zero: many calls of one cell, a healthy all-zero gradient in the
  first call, and a ``view`` that must stay fast.
- ``transforms``: torchvision transforms (modules) on the data before a small CNN: not rows of
  ``view``'s heatmap.
"""

from __future__ import annotations

import sys

import torch
from torch import nn
from torch.nn import functional as F

torch.set_num_threads(1)
STEPS = 3


def fit(model: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int = STEPS) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        print(f"loss {loss.item():.4f}")


class Recurrent(nn.Module):
    """An LSTM and a projection of its output, returning ``(out, (h, c))`` as ``nn.LSTM``."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(8, 8, batch_first=True)
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        out, (h, c) = self.lstm(x)
        return self.proj(out), (h, c)


class Tagger(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(4, 8)
        self.rnn = Recurrent()
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.embed(x))  # (h, c) unused
        return self.head(out[:, -1])


def lstm() -> None:
    fit(Tagger(), torch.randn(4, 5, 4), torch.randint(0, 3, (4,)))


class Half(nn.Module):
    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.block(x))


class SharedBlock(nn.Module):
    """An encoder and a decoder holding the same block (weights tied by sharing the module)."""

    def __init__(self) -> None:
        super().__init__()
        block = nn.Linear(8, 8)
        self.encoder = Half(block)
        self.decoder = Half(block)
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.decoder(self.encoder(x)))


def two_parents() -> None:
    fit(SharedBlock(), torch.randn(4, 8), torch.randint(0, 3, (4,)))


class Projector(nn.Module):
    """BYOL's ``NetWrapper``: runs the backbone it holds, then a projection."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net
        self.projection = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.projection(self.net(x))


class Learner(nn.Module):
    """BYOL's learner: the backbone registered on it (``self.net``) and inside the wrapper that
    calls it (``self.online_encoder.net``); only the wrapper calls it."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
        self.online_encoder = Projector(self.net)
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.online_encoder(x))


def wrapped() -> None:
    fit(Learner(), torch.randn(4, 8), torch.randint(0, 3, (4,)))


class LazyEncoder(nn.Module):
    """Builds its layers on the first call, once the input's width is known."""

    def __init__(self) -> None:
        super().__init__()
        self.net: nn.Sequential | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.net is None:
            self.net = nn.Sequential(nn.Linear(x.shape[-1], 8), nn.ReLU())
        return self.net(x)


class LazyHead(nn.Module):
    """An encoder and a head both made in ``forward`` (registered there), sized on a first
    call before the optimizer is made, as lazy models are."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = LazyEncoder()
        self.fc: nn.Module | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x)
        if self.fc is None:
            self.fc = nn.Linear(h.shape[-1], 3)
        return self.fc(h)


def made_in_forward() -> None:
    model = LazyHead()
    x = torch.randn(4, 4)
    with torch.no_grad():
        model(x)  # sizes the layers
    fit(model, x, torch.randint(0, 3, (4,)))


class GRUCell(nn.Module):
    """makemore's GRU cell, written out: a reset gate, a candidate, an update gate."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.xh_to_z = nn.Linear(2 * width, width)
        self.xh_to_r = nn.Linear(2 * width, width)
        self.xh_to_hbar = nn.Linear(2 * width, width)

    def forward(self, xt: torch.Tensor, hprev: torch.Tensor) -> torch.Tensor:
        xh = torch.cat([xt, hprev], dim=1)
        r = torch.sigmoid(self.xh_to_r(xh))
        hprev_reset = r * hprev
        xhr = torch.cat([xt, hprev_reset], dim=1)
        hbar = torch.tanh(self.xh_to_hbar(xhr))
        z = torch.sigmoid(self.xh_to_z(xh))
        return (1 - z) * hprev + z * hbar


class CharGRU(nn.Module):
    """makemore's RNN with its GRU cell: the hidden state starts at a zero parameter, so the
    reset gate of the first call gets an all-zero gradient (healthy: ``r * hprev`` with hprev
    0), and the cell is unrolled over the sequence."""

    def __init__(self, vocab: int = 27, width: int = 16) -> None:
        super().__init__()
        self.start = nn.Parameter(torch.zeros(1, width))
        self.wte = nn.Embedding(vocab, width)
        self.cell = GRUCell(width)
        self.lm_head = nn.Linear(width, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        emb = self.wte(idx)
        hprev = self.start.expand((idx.shape[0], -1))
        hiddens = []
        for i in range(idx.shape[1]):
            hprev = self.cell(emb[:, i, :], hprev)
            hiddens.append(hprev)
        return self.lm_head(torch.stack(hiddens, 1))


def gru() -> None:
    torch.manual_seed(0)
    model = CharGRU()
    idx = torch.randint(0, 27, (4, 17))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(STEPS):
        opt.zero_grad()
        logits = model(idx[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, 27), idx[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        print(f"loss {loss.item():.4f}")


def transforms() -> None:
    """A small CNN fed images through torchvision transforms (modules: the hooks see them)."""
    from torchvision.transforms import v2

    augment = v2.Compose([v2.RandomHorizontalFlip(), v2.Normalize([0.5] * 3, [0.25] * 3)])
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    y = torch.randint(0, 3, (4,))
    for _ in range(STEPS):
        x = augment(torch.rand(4, 3, 8, 8))
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        print(f"loss {loss.item():.4f}")


CASES = {"lstm": lstm, "two_parents": two_parents, "wrapped": wrapped,
         "made_in_forward": made_in_forward, "gru": gru, "transforms": transforms}

if __name__ == "__main__":
    torch.manual_seed(0)
    CASES[sys.argv[1]]()
