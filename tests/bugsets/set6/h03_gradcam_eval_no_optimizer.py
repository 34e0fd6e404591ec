"""Healthy: Grad-CAM on a torchvision ResNet-18: eval mode, a backward of one class score per
image, no optimizer at all.

Looks like: backward passes under ``model.eval()`` (BatchNorm frozen), gradients that reach the
parameters and are never used or zeroed (they accumulate over the three images), no optimizer,
nothing ever updated, a forward hook that keeps an activation and a tensor hook on it. Grad-CAM
only reads the gradient of a class score w.r.t. the last convolutional block's activations.

Asserts: each heat map is finite, non-negative, not all zero; the weights never change.

Mirrors: b04, b18 (eval mode, parameters that get gradients). Source:
https://github.com/jacobgil/pytorch-grad-cam (the method as commonly implemented).
"""
import torch
import torch.nn.functional as F
from torchvision.models import resnet18


def main():
    torch.manual_seed(0)
    model = resnet18(num_classes=10)
    model.eval()
    saved = {}

    def keep(module, inputs, output):
        saved["act"] = output
        output.register_hook(lambda g: saved.__setitem__("grad", g))

    model.layer4.register_forward_hook(keep)
    before = model.fc.weight.detach().clone()
    for i in range(3):
        image = torch.randn(1, 3, 64, 64)
        scores = model(image)
        cls = scores.argmax(1).item()
        scores[0, cls].backward()
        weights = saved["grad"].mean((2, 3), keepdim=True)
        cam = F.relu((weights * saved["act"]).sum(1)).detach()
        print(f"image {i}: class {cls}, cam max {cam.max().item():.4f}")
        assert torch.isfinite(cam).all() and cam.max() > 0
    assert torch.equal(before, model.fc.weight)


if __name__ == "__main__":
    main()
