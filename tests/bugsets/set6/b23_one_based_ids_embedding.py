"""Bug: 1-based item ids looked up in an ``nn.Embedding(num_items, d)``: index out of range.

A recommender maps item ids 1..N (as stored in the database) straight into
``nn.Embedding(N, d)``, whose rows are 0..N-1. Id 0 never occurs and id N does: the first
batch containing item N crashes the forward with "IndexError: index out of range in self" at
step 3 (the batches before it hold no item N), exit 1. Before that, row 0 never gets a gradient.

Asserts nothing: the script dies in the embedding's forward at step 3, by design.

Source: https://github.com/bentrevett/pytorch-seq2seq/issues/89 (nn.Embedding runtime error:
index out of range, the table one row short).
"""
import torch
import torch.nn.functional as F
from torch import nn

N_USERS, N_ITEMS = 50, 40


class MF(nn.Module):
    def __init__(self):
        super().__init__()
        self.user_embed = nn.Embedding(N_USERS, 16)
        self.item_embed = nn.Embedding(N_ITEMS, 16)  # BUG: ids are 1..N_ITEMS

    def forward(self, users, items):
        return (self.user_embed(users) * self.item_embed(items)).sum(-1)


def main():
    torch.manual_seed(0)
    model = MF()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    users = torch.randint(0, N_USERS, (320,))
    items = torch.randint(1, N_ITEMS, (320,))  # 1-based ids, N_ITEMS itself below
    items[3 * 32 + 7] = N_ITEMS  # the newest item first shows up in batch 3
    ratings = torch.rand(320) * 5
    for step in range(10):
        idx = torch.arange(step * 32, step * 32 + 32)
        optimizer.zero_grad()
        loss = F.mse_loss(model(users[idx], items[idx]), ratings[idx])
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
