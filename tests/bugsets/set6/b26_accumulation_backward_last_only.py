"""Bug: gradient accumulation that calls ``backward()`` once, after the loop, on the last
micro-batch's loss.

The window loop overwrites ``loss = criterion(...) / ACCUM`` on every micro-batch and calls
``loss.backward()`` once after it: only the last micro-batch of each window contributes a
gradient (at a quarter of its weight); the other three are computed and thrown away. The
effective batch is 4x smaller than intended and the update 4x weaker.

Asserts: of the 4 micro-batch losses of each window, only the last one reaches backward.

Source: https://github.com/ZiqiaoPeng/DualTalk/issues/9 (gradient accumulation written wrong)
and https://github.com/pytorch/ignite/issues/583 (the gradient accumulation example fixed).
"""
import torch
from torch import nn

ACCUM = 4


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 1))
    criterion = nn.MSELoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    x = torch.randn(1024, 12)
    y = x[:, :3].sum(1, keepdim=True)
    for window in range(10):
        optimizer.zero_grad()
        reached = []
        for micro in range(ACCUM):
            i = (window * ACCUM + micro) * 16
            loss = criterion(model(x[i:i + 16]), y[i:i + 16]) / ACCUM
            loss.register_hook(lambda g, micro=micro, reached=reached: reached.append(micro))
        loss.backward()  # BUG: belongs inside the loop
        assert reached == [ACCUM - 1]
        optimizer.step()
        print(f"window {window} loss {loss.item() * ACCUM:.4f}")
    print("only the last micro-batch of each window reached backward")


if __name__ == "__main__":
    main()
