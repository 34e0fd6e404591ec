"""torchvision ResNet-50 (random weights): a forward at 1x3x224x224, a backward from out[0][0].

    hooktrace run samples/resnet_features.py
    hooktrace show hooktrace.jsonl --phase backward
"""

import torch
import torchvision


def main() -> None:
    torch.manual_seed(0)
    model = torchvision.models.resnet50(weights=None)
    image = torch.randn(1, 3, 224, 224)
    out = model(image)
    out[0][0].backward()
    print(f"logits {tuple(out.shape)}, conv1 grad norm {model.conv1.weight.grad.norm():.4f}")


if __name__ == "__main__":
    main()
