"""Healthy: a Transformer classifier trained with linear warm-up from lr 0 (LambdaLR), then
constant.

Looks like: an optimizer step at step 0 that changes nothing (lr = 0 exactly), with gradients
present; the first few updates are tiny. This is the standard warm-up of Transformer recipes
(``get_linear_schedule_with_warmup`` starts at 0).

Asserts: the weights are unchanged by step 0 and changed by the end; the loss falls.

Mirrors: b07 (a learning rate that looks wrong). Source:
https://github.com/huggingface/transformers/blob/main/src/transformers/optimization.py
(get_linear_schedule_with_warmup: lr factor current_step / num_warmup_steps, 0 at step 0).
"""
import torch
import torch.nn.functional as F
from torch import nn

WARMUP = 8


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 32)
        self.encoder = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
        self.head = nn.Linear(32, 2)

    def forward(self, tokens):
        return self.head(self.encoder(self.embed(tokens)).mean(1))


def main():
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, s / WARMUP))
    start = model.head.weight.detach().clone()
    losses = []
    for step in range(30):
        tokens = torch.randint(0, 10, (32, 6))
        labels = (tokens == 7).any(1).long()
        optimizer.zero_grad()
        loss = F.cross_entropy(model(tokens), labels)
        loss.backward()
        optimizer.step()
        scheduler.step()
        if step == 0:
            assert torch.equal(start, model.head.weight)
        losses.append(loss.item())
        print(f"step {step:2d} lr {optimizer.param_groups[0]['lr']:.2e} loss {loss.item():.4f}")
    assert not torch.equal(start, model.head.weight)
    assert sum(losses[-5:]) < sum(losses[:5])


if __name__ == "__main__":
    main()
