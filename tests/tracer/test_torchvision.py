"""Real torchvision models (random weights): traced forward + backward without error, and every
module call that ran forward also gets its backward."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
import torch
import torchvision.models as tvm
from helpers import events, read_log
from torch import nn
from torch.nn import functional as F

import hooktrace
from hooktrace.check.checklog import run_checks
from hooktrace.log import schema

pytestmark = pytest.mark.slow

# name -> (builder, input shape, output -> tensor the loss is taken from, names without backward)
MODELS: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...], Callable[[Any], torch.Tensor],
                        str | None]] = {
    "resnet50": (lambda: tvm.resnet50(weights=None), (1, 3, 224, 224), lambda o: o, None),
    "mobilenet_v2": (lambda: tvm.mobilenet_v2(weights=None), (1, 3, 224, 224), lambda o: o, None),
    "densenet121": (lambda: tvm.densenet121(weights=None), (1, 3, 224, 224), lambda o: o, None),
    "efficientnet_b0": (lambda: tvm.efficientnet_b0(weights=None), (1, 3, 224, 224),
                        lambda o: o, None),
    # batch 2: in training mode the aux head's BatchNorm sees a 1x1 map and needs > 1 value
    "inception_v3": (lambda: tvm.inception_v3(weights=None, aux_logits=True, init_weights=False),
                     (2, 3, 299, 299), lambda o: o.logits, "AuxLogits"),
    "vit_b_16": (lambda: tvm.vit_b_16(weights=None), (1, 3, 224, 224), lambda o: o, None),
    "convnext_tiny": (lambda: tvm.convnext_tiny(weights=None), (1, 3, 224, 224),
                      lambda o: o, None),
}

# modules registered but never called: MultiheadAttention's out_proj (its weight is used
# functionally), StochasticDepth of blocks without a residual connection
IDLE = {
    "vit_b_16": ".self_attention.out_proj",
    "efficientnet_b0": ".0.stochastic_depth",
}


def calls(path: Path, phase: str) -> set[tuple[str, int]]:
    return {(e.fqn, e.call) for e in events(path, phase)}


@pytest.mark.parametrize("name", list(MODELS))
def test_torchvision_forward_backward(log_path: Path, name: str) -> None:
    build, shape, pick, no_backward = MODELS[name]
    torch.manual_seed(0)
    model = build().train()
    x = torch.randn(*shape)
    with hooktrace.trace(log_path, model=model):
        pick(model(x)).sum().backward()

    records = read_log(log_path)
    end = records[-1]
    assert isinstance(end, schema.End)
    assert (end.status, end.steps, end.tracer_error, end.dropped) == ("ok", 1, None, None)
    assert [(r.model, r.cls) for r in records if isinstance(r, schema.Model)] == [
        (0, type(model).__name__)]

    forward = calls(log_path, "forward")
    backward = calls(log_path, "backward")
    # every registered module ran, except the few that torchvision never calls: these models
    # build nothing inside forward, so no other name may appear
    idle = IDLE.get(name)
    assert {n for n, _ in model.named_modules()} - {n for n, _ in forward} == {
        n for n, _ in model.named_modules() if idle and n.endswith(idle)}
    assert {n for n, _ in forward} <= {n for n, _ in model.named_modules()}
    if no_backward is None:
        assert backward == forward
    else:
        excluded = {c for c in forward if c[0] == no_backward or c[0].startswith(no_backward + ".")}
        assert excluded, f"{no_backward} did not run"
        assert backward == forward - excluded

    fwd = events(log_path, "forward")
    bwd = events(log_path, "backward")
    assert len(fwd) == len(forward) and len(bwd) == len(backward)  # no duplicates
    assert all(e.step == 0 for e in fwd + bwd)
    assert end.events == len(fwd) + len(bwd)
    by_seq = {e.seq: e for e in fwd}
    for b in bwd:
        f = by_seq[b.fwd]
        assert (f.fqn, f.call) == (b.fqn, b.call)
        assert len(b.grad_output_shapes) == b.grad_output_len == len(f.output_shapes)
        assert len(b.grad_input_shapes) == b.grad_input_len == len(f.input_shapes)
    # the root starts the backward pass
    assert bwd[0].fqn == ""
    assert bwd[0].grad_input_shapes == [None]
    assert bwd[0].grad_output_shapes[0] == fwd[-1].output_shapes[0]


def test_resnet50_feature_shapes(log_path: Path) -> None:
    torch.manual_seed(0)
    model = tvm.resnet50(weights=None)
    x = torch.randn(1, 3, 224, 224)
    with hooktrace.trace(log_path, model=model):
        out = model(x)
        out[0][0].backward()
    fwd = {e.fqn: e for e in events(log_path, "forward")}
    bwd = {e.fqn: e for e in events(log_path, "backward")}
    assert fwd["layer3"].output_shapes == [[1, 1024, 14, 14]]
    assert fwd["layer4"].input_shapes == [[1, 1024, 14, 14]]
    assert fwd["layer4"].output_shapes == [[1, 2048, 7, 7]]
    assert fwd["fc"].output_shapes == [[1, 1000]]
    assert fwd[""].output_shapes == [[1, 1000]]
    assert bwd["layer4"].grad_output_shapes == [[1, 2048, 7, 7]]
    assert bwd["layer4"].grad_input_shapes == [[1, 1024, 14, 14]]
    assert bwd["fc"].grad_output_shapes == [[1, 1000]]
    assert bwd["avgpool"].grad_output_shapes == [[1, 2048, 1, 1]]
    assert bwd["conv1"].grad_input_shapes == [None]
    order = [e.fqn for e in events(log_path, "backward")]
    assert order[:3] == ["", "fc", "avgpool"]
    assert order.index("layer4") < order.index("layer3") < order.index("layer2")
    assert order.index("layer1") < order.index("maxpool") < order.index("relu")
    assert order.index("relu") < order.index("bn1") < order.index("conv1")
    assert order[-1] == "conv1"


def test_resnet18_log_is_small(log_path: Path) -> None:
    """Issue 6's size target: <= 120 bytes per event on resnet18 (batch 8 at 64x64, training
    steps with statistics on), counting every record written per step."""
    torch.manual_seed(0)
    model = tvm.resnet18(weights=None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(8, 3, 64, 64)
    with hooktrace.trace(log_path, model=model, steps="all"):
        for _ in range(3):
            optimizer.zero_grad()
            model(x).sum().backward()
            optimizer.step()
    per_step = events_count = 0
    # the once-per-log records: the header, names, the end, and the ledgers written when
    # tracing stops (the loss's values, a few bytes a pass; the parameters that never moved,
    # the optimizers' learning rates and steps, the sampled parameters' step facts)
    once = ("header", "model", "module", "tensors", "end", "loss-values", "params-unmoved",
            "optimizer-lrs", "optimizer-steps", "step-sample")
    for line in log_path.read_bytes().splitlines(keepends=True):
        record = orjson.loads(line)
        kind = record["kind"] if record["type"] == "signal" else record["type"]
        if kind not in once:
            per_step += len(line)
        events_count += kind in ("forward", "backward")
    assert events_count == 3 * 152
    assert per_step / events_count <= 120


@pytest.mark.parametrize("name", ["efficientnet_b0", "convnext_tiny", "swin_t"])
def test_training_steps_are_no_false_alarm(log_path: Path, name: str) -> None:
    """Ten training steps of batch 2: stochastic depth drops whole branches now and then (at
    most notes), EfficientNet's in-place Dropout on a flattened view loses no gradient, and
    check finds no problem."""
    torch.manual_seed(0)
    model = getattr(tvm, name)(weights=None, num_classes=4).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with hooktrace.trace(log_path, model=model):
        for _ in range(10):
            optimizer.zero_grad()
            loss = F.cross_entropy(model(torch.randn(2, 3, 64, 64)), torch.randint(0, 4, (2,)))
            loss.backward()
            optimizer.step()
    assert not any(orjson.loads(line).get("lost") for line in log_path.read_bytes().splitlines())
    assert run_checks(log_path).problems == []


def test_detection_training_is_no_false_alarm(log_path: Path) -> None:
    """Faster R-CNN's RPN head runs once per feature level; the box loss reads only anchors
    that match a target, and on small images no anchor of the coarsest level does: that call
    of ``rpn.head.bbox_pred`` gets an exactly-zero gradient while its other calls train it.
    check finds no problem (it said "multiplied by 0 or fully masked" before)."""
    torch.manual_seed(0)
    model = tvm.detection.fasterrcnn_mobilenet_v3_large_320_fpn(
        weights=None, weights_backbone=None, num_classes=3).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    images = [torch.rand(3, 128, 128) for _ in range(2)]
    targets = [{"boxes": torch.tensor([[10.0, 10.0, 60.0, 60.0]]), "labels": torch.tensor([1])}
               for _ in range(2)]
    with hooktrace.trace(log_path, model=model):
        for _ in range(2):
            optimizer.zero_grad()
            sum(model(images, targets).values()).backward()
            optimizer.step()
    zero = {e.fqn for e in events(log_path, "backward")
            if isinstance(e, schema.BackwardEvent) and e.grad_output_stats
            and all(s is not None and s[0] == 0 for s in e.grad_output_stats)}
    assert "rpn.head.bbox_pred" in zero  # the case is what it says
    assert run_checks(log_path).problems == []
