"""Field programs for the data flow between calls (issue 47, item 4): shapes of real training
programs whose edges a picture lost or made up; one per CASE (argv[1]). Each trains a tiny
seeded model on CPU for a few steps and is healthy.

- ``critics``: SAC (SB3): an actor and two critics, each with its own ``nn.Flatten`` feature
  extractor, which returns a 2-d batch of observations as it is; the critics ``cat`` the
  features and the actions (none of them needs a gradient; SB3's default,
  ``share_features_extractor=False``, with gradients on); the target is computed under
  ``no_grad`` from the actor's next actions. ``critics_image``: the same on 1x2x4 observations,
  which the extractors really flatten (the healthy look-alike: each one made what its critic
  reads).
- ``validation``: llm.c's ``train_gpt2.py``: a tiny GPT evaluated under ``no_grad`` before
  its training step (in the same step), its blocks adding their outputs into the residual.
- ``two_heads``: a segmentation model's ``out`` and ``aux`` heads on one backbone, the loss
  summing both (torchvision's references); ``one_head``: the same model without its aux head
  (``aux_loss=False``), the loss of ``out`` (the healthy look-alike).
"""

from __future__ import annotations

import sys

import torch
from torch import nn
from torch.nn import functional as F

torch.set_num_threads(1)
STEPS = 2


class Actor(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.features = nn.Flatten()
        self.mu = nn.Linear(width, 2)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.mu(self.features(obs)))


class Critic(nn.Module):
    """SB3's ``ContinuousCritic``: ``cat([features, actions])`` into each Q network."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.features = nn.Flatten()
        self.qf0 = nn.Sequential(nn.Linear(width + 2, 16), nn.ReLU(), nn.Linear(16, 1))
        self.qf1 = nn.Sequential(nn.Linear(width + 2, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, obs: torch.Tensor, actions: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.cat([self.features(obs), actions], dim=1)
        return self.qf0(x), self.qf1(x)


def critics(image: bool = False) -> None:
    shape = (1, 2, 4) if image else (8,)
    actor, critic, critic_target = Actor(8), Critic(8), Critic(8)
    critic_target.load_state_dict(critic.state_dict())
    actor_opt = torch.optim.Adam(actor.parameters(), lr=1e-3)
    critic_opt = torch.optim.Adam(critic.parameters(), lr=1e-3)
    for _ in range(STEPS):
        obs, next_obs = torch.randn(4, *shape), torch.randn(4, *shape)
        actions, reward = torch.rand(4, 2) * 2 - 1, torch.randn(4, 1)
        with torch.no_grad():
            next_actions = actor(next_obs)
            target = reward + 0.99 * torch.min(*critic_target(next_obs, next_actions))
        q0, q1 = critic(obs, actions)
        critic_loss = F.mse_loss(q0, target) + F.mse_loss(q1, target)
        critic_opt.zero_grad()
        critic_loss.backward()
        critic_opt.step()
        actor_loss = -critic(obs, actor(obs))[0].mean()
        actor_opt.zero_grad()
        actor_loss.backward()
        actor_opt.step()
        print(f"critic {critic_loss.item():.4f} actor {actor_loss.item():.4f}")


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(width)
        self.attn = nn.Linear(width, width)
        self.ln_2 = nn.LayerNorm(width)
        self.mlp = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """llm.c's GPT, its shape: token and position embeddings added, blocks adding into the
    residual stream, a final LayerNorm and the head."""

    def __init__(self, vocab: int = 16, width: int = 8, layers: int = 2) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(8, width)
        self.h = nn.ModuleList(Block(width) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1])
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def validation() -> None:
    model = GPT()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randint(0, 16, (4, 7))
    for step in range(STEPS):
        if step == 0:  # llm.c validates at step 0, before training
            model.eval()
            with torch.no_grad():
                logits = model(data[:, :-1])
                val = F.cross_entropy(logits.reshape(-1, 16), data[:, 1:].reshape(-1))
            model.train()
            print(f"val {val.item():.4f}")
        logits = model(data[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, 16), data[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"loss {loss.item():.4f}")


class Segmenter(nn.Module):
    """torchvision's FCN: a backbone, an ``out`` head and an ``aux`` head, returned as a
    dict."""

    def __init__(self, aux: bool) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU())
        self.classifier = nn.Conv2d(8, 4, 1)
        self.aux_classifier = nn.Conv2d(8, 4, 1) if aux else None

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        features = self.backbone(x)
        found = {"out": self.classifier(features)}
        if self.aux_classifier is not None:
            found["aux"] = self.aux_classifier(features)
        return found


def heads(both: bool) -> None:
    model = Segmenter(aux=both)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(2, 3, 6, 6), torch.randint(0, 4, (2, 6, 6))
    for _ in range(STEPS):
        found = model(x)
        loss = F.cross_entropy(found["out"], y)
        if both:
            loss = loss + 0.5 * F.cross_entropy(found["aux"], y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"loss {loss.item():.4f}")


CASES = {"critics": critics, "critics_image": lambda: critics(image=True),
         "validation": validation, "two_heads": lambda: heads(True),
         "one_head": lambda: heads(False)}

if __name__ == "__main__":
    torch.manual_seed(0)
    CASES[sys.argv[1]]()
