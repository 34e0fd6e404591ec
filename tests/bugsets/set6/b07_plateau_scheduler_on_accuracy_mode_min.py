"""Bug: ``ReduceLROnPlateau`` left in its default ``mode="min"`` but stepped with an accuracy.

The scheduler is fed the validation accuracy each "epoch" (4 steps here). In "min" mode a
rising accuracy is never an improvement, so after ``patience`` epochs the learning rate is
halved, and again every epoch after that, exactly while the model is improving: by the end
lr is 1e-3 x 0.5**8 and the updates have all but stopped while the training loss is still far
from its floor.

Asserts: accuracy rose, and the learning rate fell more than 100x.

Source: the PyTorch docs of ReduceLROnPlateau (``mode``: "min" for a quantity that should fall,
"max" for one that should rise;
https://pytorch.org/docs/stable/generated/torch.optim.lr_scheduler.ReduceLROnPlateau.html) and
https://wiki.cloudfactory.com/docs/mp-wiki/scheduler/reducelronplateau (min and max modes).
"""
import torch
import torch.nn.functional as F
from torch import nn


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 5))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, factor=0.5, patience=0)
    # BUG: mode="min" (the default) for a metric that should go up
    x, xv = torch.randn(1280, 20), torch.randn(256, 20)
    y, yv = x[:, :5].argmax(1), xv[:, :5].argmax(1)
    accs = []
    for step in range(40):
        idx = torch.arange(step * 32, step * 32 + 32) % 1280
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x[idx]), y[idx])
        loss.backward()
        optimizer.step()
        if step % 4 == 3:
            with torch.no_grad():
                acc = (model(xv).argmax(1) == yv).float().mean().item()
            scheduler.step(acc)
            accs.append(acc)
            print(f"step {step:2d} loss {loss.item():.4f} val acc {acc:.3f} "
                  f"lr {optimizer.param_groups[0]['lr']:.2e}")
    assert accs[-1] > accs[0]
    assert optimizer.param_groups[0]["lr"] < 0.05 / 100
    print("the lr was cut every epoch while the accuracy rose")


if __name__ == "__main__":
    main()
