"""Healthy: a causal language model with correctly shifted labels, trained on random tokens:
the loss stays at the data's entropy.

Looks like: a model that does not learn: the loss sits at ln 16 = 2.77 from step 0 to the end,
while every gradient is finite and non-zero and the weights move. Uniformly random tokens are
unpredictable; the best a correct next-token model can do is the uniform distribution. The
logits at position t are compared with the token at t + 1 (``logits[:, :-1]`` vs
``tokens[:, 1:]``).

Asserts: the loss stays within 0.15 of ln 16 over the last 10 steps, and the weights moved.

Mirrors: b13 (labels not shifted: the loss collapses below the entropy). Source:
https://github.com/tloen/alpaca-lora/issues/365 (labels equal to input_ids, shifted in the loss).
"""
import math

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, T, D = 16, 12, 32


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, D)
        self.pos = nn.Embedding(T, D)
        self.block = nn.TransformerEncoderLayer(D, 4, 64, dropout=0.0, batch_first=True)
        self.lm_head = nn.Linear(D, VOCAB)

    def forward(self, tokens):
        t = tokens.shape[1]
        h = self.tok(tokens) + self.pos(torch.arange(t))
        mask = nn.Transformer.generate_square_subsequent_mask(t)
        return self.lm_head(self.block(h, src_mask=mask, is_causal=True))


def main():
    torch.manual_seed(0)
    model = TinyLM()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    before = model.lm_head.weight.detach().clone()
    losses = []
    for step in range(40):
        tokens = torch.randint(0, VOCAB, (32, T))
        optimizer.zero_grad()
        logits = model(tokens)
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        print(f"step {step:2d} loss {loss.item():.4f}")
    assert all(abs(v - math.log(VOCAB)) < 0.15 for v in losses[-10:]), losses[-10:]
    assert not torch.equal(before, model.lm_head.weight)


if __name__ == "__main__":
    main()
