"""Bug: class weights for an imbalanced dataset computed as frequencies instead of inverse
frequencies.

``weight = counts / counts.sum()`` is passed to ``CrossEntropyLoss`` where
``counts.sum() / counts`` (or its normalised form) was meant. With a 90/7/3 class split, the
rare classes now weigh 30x *less* than the majority instead of more: the model predicts the
majority class for everything and the rare classes' recall stays at 0.

Asserts: the criterion's weight rises with frequency, and the recall of classes 1 and 2 is 0.

Source: https://discuss.pytorch.org/t/what-is-the-weight-values-mean-in-torch-nn-crossentropyloss/11455
(``1/class_size`` is the typical choice) and
https://androidkt.com/how-to-use-class-weight-in-crossentropyloss-for-an-imbalanced-dataset/.
"""
import torch
from torch import nn


def main():
    torch.manual_seed(0)
    n = 2000
    y = torch.multinomial(torch.tensor([0.90, 0.07, 0.03]), n, replacement=True)
    x = torch.randn(n, 8) + 0.6 * nn.functional.one_hot(y, 8).float()
    counts = torch.bincount(y, minlength=3).float()
    criterion = nn.CrossEntropyLoss(weight=counts / counts.sum())  # BUG: inverse meant
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for step in range(40):
        idx = torch.arange(step * 50, step * 50 + 50) % n
        optimizer.zero_grad()
        loss = criterion(model(x[idx]), y[idx])
        loss.backward()
        optimizer.step()
        print(f"step {step:2d} loss {loss.item():.4f}")
    assert criterion.weight[0] > criterion.weight[1] > criterion.weight[2]
    with torch.no_grad():
        pred = model(x).argmax(1)
    recall = [((pred == c) & (y == c)).sum().item() / (y == c).sum().item() for c in (1, 2)]
    print(f"recall of the rare classes {recall}")
    assert recall == [0.0, 0.0]


if __name__ == "__main__":
    main()
