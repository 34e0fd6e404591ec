"""Healthy: knowledge distillation the Hinton way: ``kl_div(log_softmax(s / T), softmax(t / T))
* T**2`` plus the hard-label cross-entropy; the teacher in eval mode under no_grad.

Looks like: a second model that runs forward every step and never gets a gradient, a loss
multiplied by T**2 = 16, a temperature dividing the logits, and ``F.kl_div`` (whose argument
order trips people up).

Asserts: the KD term is non-negative at every step, the student's agreement with the teacher
rises, and the teacher never changes.

Mirrors: b24 (kl_div on raw logits). Source:
https://github.com/haitongli/knowledge-distillation-pytorch/blob/master/model/net.py
(loss_fn_kd) and the PyTorch KLDivLoss docs.
"""
import torch
import torch.nn.functional as F
from torch import nn

T, ALPHA = 4.0, 0.7


def main():
    torch.manual_seed(0)
    teacher = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 5))
    student = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 5))
    teacher.eval()
    optimizer = torch.optim.Adam(student.parameters(), lr=1e-2)
    before = teacher[0].weight.detach().clone()
    xv = torch.randn(256, 16)
    with torch.no_grad():
        tv = teacher(xv).argmax(1)
        agree0 = (student(xv).argmax(1) == tv).float().mean().item()
    for step in range(30):
        x = torch.randn(64, 16)
        with torch.no_grad():
            t_logits = teacher(x)
        y = t_logits.argmax(1)
        s_logits = student(x)
        kd = F.kl_div(F.log_softmax(s_logits / T, dim=1), F.softmax(t_logits / T, dim=1),
                      reduction="batchmean") * T * T
        loss = ALPHA * kd + (1 - ALPHA) * F.cross_entropy(s_logits, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        assert kd.item() >= 0
        print(f"step {step:2d} kd {kd.item():.4f} loss {loss.item():.4f}")
    with torch.no_grad():
        agree = (student(xv).argmax(1) == tv).float().mean().item()
    print(f"agreement with the teacher {agree0:.3f} -> {agree:.3f}")
    assert agree > agree0
    assert torch.equal(before, teacher[0].weight)


if __name__ == "__main__":
    main()
