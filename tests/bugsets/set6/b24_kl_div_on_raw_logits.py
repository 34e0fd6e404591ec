"""Bug: knowledge distillation with ``F.kl_div(student_logits, teacher_probs)``: the input must be
log-probabilities.

``kl_div(input, target)`` computes ``sum target * (log target - input)`` and expects ``input``
to be log-probabilities. Given raw logits, the loss is linear in the student's logits and has
no minimum: the student lowers it by raising every logit, the "KL" turns negative within a few
steps and keeps falling; the student's logits grow without bound while its agreement with the
teacher does not improve.

Asserts: the distillation loss goes negative and keeps decreasing, and the student's mean logit
grows.

Source: https://github.com/pytorch/pytorch/issues/60928 (negative loss value of nn.KLDivLoss) and
https://github.com/sebastian-hofstaetter/matchmaker/issues/18 (kl_div given softmax, not
log_softmax, as its input).
"""
import torch
import torch.nn.functional as F
from torch import nn


def main():
    torch.manual_seed(0)
    teacher = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 5))
    student = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 5))
    teacher.eval()
    optimizer = torch.optim.Adam(student.parameters(), lr=1e-2)
    losses, means = [], []
    for step in range(30):
        x = torch.randn(64, 16)
        with torch.no_grad():
            t_prob = F.softmax(teacher(x) / 2.0, dim=1)
        s_logits = student(x)
        loss = F.kl_div(s_logits / 2.0, t_prob, reduction="batchmean")  # BUG: log_softmax
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        means.append(s_logits.mean().item())
        print(f"step {step:2d} kd loss {loss.item():.4f} mean logit {means[-1]:.3f}")
    assert losses[-1] < 0 and losses[-1] < losses[len(losses) // 2] < losses[0]
    assert means[-1] > means[0] + 1.0, means
    print("the KD loss is negative and falling: the student's logits grow without bound")


if __name__ == "__main__":
    main()
