"""Bug: the tutorial's sequence-first ``PositionalEncoding`` applied to batch-first input.

The PyTorch tutorial's module keeps ``pe`` as (max_len, 1, d) and adds ``pe[:x.size(0)]``,
assuming x is (seq, batch, d). The model feeds (batch, seq, d): ``x.size(0)`` is the batch
size, so sample b gets the encoding of "position b" added to every one of its tokens, the same
vector at every position, and the Transformer (attention is permutation-equivariant) cannot
tell the order of tokens at all. The task is order-dependent (is the first token larger than
the last?) and the loss stays at ln 2.

Asserts: the model's output is unchanged when a sequence is reversed, and the loss stays above
0.6.

Source: https://github.com/pytorch/tutorials/issues/1547 (Positional Encoding does not match the
input tensor size), https://github.com/tanjimin/C.Origami/issues/42 (pe[:x.size(0)] on
[batch, seq, dim]) and https://github.com/songyangco/GETNext/issues/2 (positional encoding
added along the batch dimension).
"""
import math

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, T, D = 10, 8, 32


class PositionalEncoding(nn.Module):
    def __init__(self, d_model, max_len=64):
        super().__init__()
        position = torch.arange(max_len).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
        pe = torch.zeros(max_len, 1, d_model)
        pe[:, 0, 0::2] = torch.sin(position * div_term)
        pe[:, 0, 1::2] = torch.cos(position * div_term)
        self.register_buffer("pe", pe)

    def forward(self, x):
        return x + self.pe[:x.size(0)]  # BUG: x is (batch, seq, d) here


class OrderNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D)
        self.pos_encoder = PositionalEncoding(D)
        self.encoder = nn.TransformerEncoderLayer(D, 4, 64, dropout=0.0, batch_first=True)
        self.head = nn.Linear(D, 2)

    def forward(self, tokens):
        h = self.encoder(self.pos_encoder(self.embed(tokens)))
        return self.head(h.mean(1))


def main():
    torch.manual_seed(0)
    model = OrderNet()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(30):
        tokens = torch.randint(0, VOCAB, (32, T))
        labels = (tokens[:, 0] > tokens[:, -1]).long()
        optimizer.zero_grad()
        loss = F.cross_entropy(model(tokens), labels)
        loss.backward()
        optimizer.step()
        print(f"step {step:2d} loss {loss.item():.4f}")
    with torch.no_grad():
        tokens = torch.randint(0, VOCAB, (1, T))
        same = torch.allclose(model(tokens), model(tokens.flip(1)), atol=1e-5)
    assert same
    assert loss.item() > 0.6
    print("the model is blind to token order: the encoding was added along the batch")


if __name__ == "__main__":
    main()
