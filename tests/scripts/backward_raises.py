"""A custom Function whose backward raises: the error passes through hooktrace's wrappers of
backward(), whose frames its traceback must not show."""

import torch


class Boom(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):  # type: ignore[no-untyped-def]
        return x * 2

    @staticmethod
    def backward(ctx, g):  # type: ignore[no-untyped-def]
        raise ValueError("bad backward")


model = torch.nn.Linear(3, 1)
Boom.apply(model(torch.randn(2, 3))).sum().backward()
