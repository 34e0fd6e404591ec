"""Exits in argument parsing (status 2, argparse's usage message) before any model is built
when ``--data`` is not given; with it, trains a small model one step."""

import argparse

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--data", required=True)
args = parser.parse_args()

model = nn.Linear(4, 2)
model(torch.randn(3, 4)).sum().backward()
