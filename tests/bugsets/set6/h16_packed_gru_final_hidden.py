"""Healthy: a GRU classifier over right-padded sequences that packs them
(``pack_padded_sequence``) and reads the final hidden state ``h_n``.

Looks like: padding positions that never reach the GRU, an embedding row (``padding_idx=0``)
that never gets a gradient, a batch sorted by nothing (``enforce_sorted=False``), and inputs
of one length producing outputs that ignore part of them.

Asserts: the logits do not change when the same sequences are padded further, and the loss
falls.

Mirrors: b12 (out[:, -1] of padded sequences). Source:
https://github.com/bentrevett/pytorch-sentiment-analysis/issues/86 (packed padded sequences
give the hidden state of the last real token).
"""
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(12, 16, padding_idx=0)
        self.gru = nn.GRU(16, 32, batch_first=True)
        self.head = nn.Linear(32, 2)

    def forward(self, tokens, lengths):
        packed = pack_padded_sequence(self.embed(tokens), lengths, batch_first=True,
                                      enforce_sorted=False)
        _, h_n = self.gru(packed)
        return self.head(h_n[-1])


def batch(n, length=20):
    lengths = torch.randint(3, 21, (n,))
    tokens = torch.randint(1, 12, (n, length))
    tokens[torch.arange(length)[None, :] >= lengths[:, None]] = 0
    return tokens, lengths, (tokens[:, 0] > 6).long()


def main():
    torch.manual_seed(0)
    model = Classifier()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for step in range(25):
        tokens, lengths, labels = batch(32)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(tokens, lengths), labels)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        print(f"step {step:2d} loss {loss.item():.4f}")
    tokens, lengths, _ = batch(8)
    with torch.no_grad():
        a = model(tokens, lengths)
        b = model(F.pad(tokens, (0, 10)), lengths)
    assert torch.allclose(a, b, atol=1e-6)
    assert sum(losses[-5:]) < sum(losses[:5])


if __name__ == "__main__":
    main()
