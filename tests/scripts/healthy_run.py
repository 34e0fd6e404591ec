"""A healthy detection model trained under ``hooktrace run`` (tests/findings/test_healthy_sweep.py):
built inside the traced run, so what it calls at construction is traced too (SSDlite runs its
backbone under ``torch.no_grad()`` to size its feature maps). Usage: NAME STEPS TRUTH, where
TRUTH receives PyTorch's own ``param.grad`` after each backward (``groundtruth.GradTruth``)."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the sweep's helpers
from groundtruth import GradTruth
from healthy_models import detection

name, steps, truth_path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
torch.manual_seed(0)
torch.set_num_threads(1)  # batches of 2 gain nothing from a second thread
case = detection(name)
truth = GradTruth(case.models)
for _ in range(steps):
    case.backward()
    truth.record()
    case.update()
truth.save(truth_path)
