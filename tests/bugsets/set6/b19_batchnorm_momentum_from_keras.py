"""Bug: ``nn.BatchNorm1d(momentum=0.99)`` ported from Keras, where momentum means the opposite.

Keras' ``BatchNormalization(momentum=0.99)`` keeps 99% of the running statistics per update;
PyTorch's ``momentum`` is the weight of the *new* batch. With 0.99 the running mean and
variance are ~the last training batch's, so evaluation normalises with one batch's noisy
statistics: the running mean of a feature whose population mean is 0 sits wherever the last
batch put it, and the eval loss is worse than the train loss on the same data.

Asserts: the running mean equals the last batch's mean to within 1% of their distance from
the population mean (a healthy momentum of 0.1 averages ~10 batches).

Source: https://stackoverflow.com/questions/60079783/difference-between-keras-batchnormalization-and-pytorchs-batchnorm2d
(momentum conventions of Keras and PyTorch) and
http://ni4muraano.hatenablog.com/entry/2017/09/02/150412 (Keras momentum 0.99 is PyTorch 0.01).
"""
import torch
import torch.nn.functional as F
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(12, 32)
        self.bn = nn.BatchNorm1d(32, momentum=0.99)  # BUG: Keras convention, meant 0.01
        self.head = nn.Linear(32, 3)

    def forward(self, x):
        return self.head(F.relu(self.bn(self.fc(x))))


def main():
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    x = torch.randn(640, 12)
    y = x[:, :3].argmax(1)
    seen = {}
    model.bn.register_forward_pre_hook(lambda module, args: seen.update(h=args[0].detach()))
    for step in range(20):
        idx = torch.randint(0, 640, (16,))
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x[idx]), y[idx])
        loss.backward()
        optimizer.step()
        print(f"step {step:2d} loss {loss.item():.4f}")
    last = seen["h"].mean(0)
    with torch.no_grad():
        population = model.fc(x).mean(0)
    gap = (model.bn.running_mean - last).norm() / (population - last).norm()
    print(f"running mean vs last batch, relative gap {gap.item():.4f}")
    assert gap < 0.05
    print("BatchNorm's running statistics are one batch's statistics")


if __name__ == "__main__":
    main()
