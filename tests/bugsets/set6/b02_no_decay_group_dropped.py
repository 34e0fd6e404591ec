"""Bug: the weight-decay param groups keep only the matrices; biases and norms are left out.

The optimizer is built the nanoGPT way, one group of >= 2-D tensors with weight decay and one of
1-D tensors (biases, LayerNorm) without, but the second group is built and never passed:
``AdamW([{"params": decay, "weight_decay": 0.1}])``. Every bias and every LayerNorm weight gets
a gradient at every step and stays at its initial value (biases 0 for the head, LayerNorm 1/0),
while the weights train. Each Linear's weight is in the optimizer and its bias is not.

Asserts: every 1-D parameter keeps its initial value with a non-zero gradient; weights move.

Source: the two groups of nanoGPT's configure_optimizers
(https://github.com/karpathy/nanoGPT/blob/master/model.py), with the second one dropped.
"""
import torch
import torch.nn.functional as F
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(12, 48)
        self.norm = nn.LayerNorm(48)
        self.hidden = nn.Linear(48, 48)
        self.head = nn.Linear(48, 3)

    def forward(self, x):
        return self.head(F.gelu(self.hidden(self.norm(F.gelu(self.inp(x))))))


def main():
    torch.manual_seed(0)
    model = Net()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}], lr=3e-3)
    # BUG: {"params": no_decay, "weight_decay": 0.0} never added
    before = [p.detach().clone() for p in no_decay]
    w_before = model.inp.weight.detach().clone()
    x = torch.randn(640, 12)
    y = (x[:, :3] + 0.5).argmax(1)  # needs the biases
    for step in range(30):
        idx = torch.arange(step * 32, step * 32 + 32) % 640
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x[idx]), y[idx])
        loss.backward()
        assert model.head.bias.grad.abs().max() > 0
        optimizer.step()
        print(f"step {step:2d} loss {loss.item():.4f}")
    assert all(torch.equal(a, b) for a, b in zip(before, no_decay, strict=True))
    assert not torch.equal(w_before, model.inp.weight)
    print("biases and LayerNorm parameters were never in the optimizer")


if __name__ == "__main__":
    main()
