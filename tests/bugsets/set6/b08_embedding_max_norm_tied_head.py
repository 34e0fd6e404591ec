"""Bug: a tied output head over an ``nn.Embedding(max_norm=1.0)`` in an autoregressive loop.

The decoder ties ``head.weight = embed.weight`` and gives the embedding ``max_norm=1.0``. With
``max_norm`` the embedding renormalises the rows it looks up *in place* on every call. The
decoding loop embeds token t, projects with the tied head (autograd saves the weight for the
backward of the projection), then embeds token t+1, which rewrites the weight in place: the
backward of the first step raises "one of the variables needed for gradient computation has
been modified by an inplace operation" (exit 1, step 0).

Asserts nothing: the script dies in ``loss.backward()`` at its first step, by design.

Source: https://github.com/pytorch/pytorch/issues/26596 (nn.Embedding with max_norm: in-place
modification, runtime error) and the note it led to, https://github.com/pytorch/pytorch/pull/45595.
"""
import torch
import torch.nn.functional as F
from torch import nn

VOCAB, DIM = 20, 16


class Decoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM, max_norm=1.0)
        self.cell = nn.GRUCell(DIM, DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)
        self.head.weight = self.embed.weight  # tied

    def forward(self, tokens):
        h = torch.zeros(tokens.shape[0], DIM)
        logits = []
        for t in range(tokens.shape[1]):
            h = self.cell(self.embed(tokens[:, t]), h)
            logits.append(self.head(h))
        return torch.stack(logits, 1)


def main():
    torch.manual_seed(0)
    model = Decoder()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    data = torch.randint(0, VOCAB, (64, 9))
    for step in range(10):
        batch = data[(step * 8) % 64:(step * 8) % 64 + 8]
        optimizer.zero_grad()
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
        loss.backward()  # RuntimeError: modified by an inplace operation
        optimizer.step()
        print(f"step {step} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
