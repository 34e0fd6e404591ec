"""Bug: inputs and labels shuffled with two different permutations.

The epoch shuffle is written as ``x = x[torch.randperm(n)]; y = y[torch.randperm(n)]``: two
independent permutations, so each input is paired with a random label. The model can only
learn the label marginal: the loss stays at the entropy of the labels (ln 4 = 1.386) and the
accuracy at chance, though every gradient is healthy.

Asserts: after the shuffle the input-label pairing is broken (the rule that made the labels
agrees with fewer than 40% of them), and the loss ends above 1.3.

Source: https://github.com/udacity/sdc-issue-reports/issues/1326 (features and labels shuffled
separately, with different shuffle orders, and nothing noticed).
"""
import torch
import torch.nn.functional as F
from torch import nn


def main():
    torch.manual_seed(0)
    n = 1024
    x = torch.randn(n, 10)
    y = x[:, :4].argmax(1)
    x = x[torch.randperm(n)]
    y = y[torch.randperm(n)]  # BUG: a second, different permutation
    agree = (x[:, :4].argmax(1) == y).float().mean().item()
    assert agree < 0.4, agree
    model = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for step in range(30):
        idx = torch.arange(step * 32, step * 32 + 32) % n
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x[idx]), y[idx])
        loss.backward()
        optimizer.step()
        print(f"step {step:2d} loss {loss.item():.4f}")
    assert loss.item() > 1.3
    print("labels no longer belong to their inputs: the loss stays at the label entropy")


if __name__ == "__main__":
    main()
