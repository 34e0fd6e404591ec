"""Bug: a GRU classifier reads ``out[:, -1]`` of right-padded sequences.

Variable-length sequences (lengths 3..20) are right-padded with zeros to length 20 and run
through ``nn.GRU(batch_first=True)`` without packing; the classifier reads the output at the
last time step, which for most sequences is the state after several padding steps, not after
the last real token. The class depends on the first real token; the longer the padding the
more the GRU has forgotten. The same sequence gets a different logit when padded to 30.

Asserts: the logits of the same sequences change when they are padded further.

Source: https://github.com/bentrevett/pytorch-sentiment-analysis/issues/86 (what not packing
padded sequences does to the final hidden state) and
https://github.com/keitakurita/practical-torchtext/issues/5 (last-timestep output wrong for
variable-length sequences).
"""
import torch
import torch.nn.functional as F
from torch import nn


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(12, 16, padding_idx=0)
        self.gru = nn.GRU(16, 32, batch_first=True)
        self.head = nn.Linear(32, 2)

    def forward(self, tokens):
        out, _ = self.gru(self.embed(tokens))
        return self.head(out[:, -1])  # BUG: the last step is padding for short sequences


def batch(n, length=20):
    lengths = torch.randint(3, 21, (n,))
    tokens = torch.randint(1, 12, (n, length))
    tokens[torch.arange(length)[None, :] >= lengths[:, None]] = 0
    labels = (tokens[:, 0] > 6).long()
    return tokens, labels


def main():
    torch.manual_seed(0)
    model = Classifier()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for step in range(25):
        tokens, labels = batch(32)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(tokens), labels)
        loss.backward()
        optimizer.step()
        print(f"step {step:2d} loss {loss.item():.4f}")
    tokens, _ = batch(8)
    with torch.no_grad():
        a = model(tokens)
        b = model(F.pad(tokens, (0, 10)))
    assert not torch.allclose(a, b, atol=1e-4)
    print("the prediction depends on how much padding follows the sequence")


if __name__ == "__main__":
    main()
