"""Precision: NaN/Inf in a forward output and whether the module's own weights held them when
it ran; a float16 gradient that is exactly zero and why.

    python precision.py CASE     (CASE: data_nan, update_overflow, loaded_nan, fp16_zero_head,
                                  bf16_adam, bf16_sgd_tiny)

``data_nan``: a NaN arrives in the data at step 2; the weights are finite (not the optimizer).
``update_overflow``: float32 weights and a hand-written update whose step overflows: the first
step makes the weights Inf and NaN (finite gradients, finite data).
``loaded_nan``: a weight is NaN before training starts (a bad checkpoint).
``fp16_zero_head``: a float16 model whose last layer starts at zero: the first layer's gradient
is exactly zero (not an underflow: the gradient at the output is not zero).
``bf16_adam``: bfloat16 weights trained by Adam at 1e-3: the updates are large enough to move
them (healthy). ``bf16_sgd_tiny``: bfloat16 weights, SGD at 1e-4: most updates round away."""

import sys

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
case = sys.argv[1]
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
if case == "fp16_zero_head":
    nn.init.zeros_(model[2].weight)
    model = model.half()
if case == "loaded_nan":
    with torch.no_grad():
        model[2].weight[0, 3] = float("nan")
if case.startswith("bf16"):
    model = model.to(torch.bfloat16)
optimizer = (torch.optim.Adam(model.parameters(), lr=1e-3) if case == "bf16_adam" else
             torch.optim.SGD(model.parameters(), lr=1e-4 if case == "bf16_sgd_tiny" else 0.01))
for step in range(5):
    x, y = torch.randn(4, 8), torch.randn(4, 1)
    if case == "fp16_zero_head":
        x, y = x.half(), y.half()
    if case.startswith("bf16"):
        x, y = x.bfloat16(), y.bfloat16()
    if case == "data_nan" and step == 2:
        x[0, 0] = float("nan")
    optimizer.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    if case == "update_overflow":
        with torch.no_grad():
            for p in model.parameters():
                p -= p.grad * 1e30 * 1e9  # past float32's 3.4e38
    else:
        optimizer.step()
print("weights finite:", all(bool(torch.isfinite(p).all()) for p in model.parameters()))
