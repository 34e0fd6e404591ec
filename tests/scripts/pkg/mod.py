"""Run with python -m pkg.mod: uses a relative import, trains one step."""

import sys

import torch

from .util import make_net

print("name", __name__)
print("package", __package__)
print("argv", sys.argv)
net = make_net()
net(torch.randn(2, 3)).sum().backward()
print("done")
