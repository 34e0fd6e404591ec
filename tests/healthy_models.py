"""Real models as ``groundtruth.Case``s, each one healthy SGD training step on a tiny random
batch of 2: torchvision classification, detection, segmentation and video models, timm models
and Hugging Face transformers built from tiny configs (no download anywhere).

Input sizes: the smallest each model accepts at which its gradients are sane. Below it a
network's last BatchNorm normalises a 1x1 map over a batch of 2 (two values per channel), and
its gradients truly explode (resnet50 at 32x32: a conv1 gradient norm of 4e9, against 3e3 at
64x64): a true ``exploding`` finding that says nothing about a healthy program. Each size is the
first of 32, 64, 96, 128, ..., 224, 256, 299 at which a step runs and every parameter's gradient
norm stays below 5e3 (half of check's exploding threshold, 1e4), one untraced step from seed 0.
resnet152 stays above it at every size (7.4e3 at 299, 1.04e4 at 224): 299. shufflenet_v2_x0_5,
3.2e3 at 32 in that step, gave 1.1e4 traced at 32 (another batch): 64.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torchvision.models as tvm
from groundtruth import Case, sgd
from torch import nn
from torch.nn import functional as F

#: a classification model's input size where it is not 64 (see the module's docstring)
SIZES = {
    **dict.fromkeys(["convnext_tiny", "convnext_small", "convnext_base", "convnext_large",
                     "googlenet", "mobilenet_v3_large", "mobilenet_v3_small",
                     "squeezenet1_0", "squeezenet1_1",
                     "swin_t", "swin_s", "swin_b", "swin_v2_t", "swin_v2_s", "swin_v2_b",
                     "vgg11", "vgg11_bn", "vgg13", "vgg13_bn", "vgg16", "vgg16_bn", "vgg19",
                     "vgg19_bn"], 32),
    **dict.fromkeys(["resnet101", "resnext101_32x8d", "resnext101_64x4d", "wide_resnet101_2"],
                    128),
    "resnet152": 299,
    "inception_v3": 299,  # the only size its auxiliary head accepts
    "maxvit_t": 224,  # its 7x7 partitions of every stage
    **dict.fromkeys(["vit_b_16", "vit_b_32", "vit_l_16", "vit_l_32", "vit_h_14"],
                    224),  # its image_size
}
#: googlenet and inception_v3 train their auxiliary heads too, weighted as torchvision's
#: reference scripts do
AUX_WEIGHT = {"googlenet": 0.3, "inception_v3": 0.4}


def _classification_loss(name: str, out: Any, target: torch.Tensor) -> torch.Tensor:
    if name in AUX_WEIGHT:  # GoogLeNetOutputs / InceptionOutputs in train mode
        aux = [o for o in out[1:] if o is not None]
        return F.cross_entropy(out[0], target) + AUX_WEIGHT[name] * sum(
            F.cross_entropy(o, target) for o in aux)
    loss: torch.Tensor = F.cross_entropy(out, target)
    return loss


def classification(name: str) -> Case:
    kwargs = {"init_weights": True} if name in AUX_WEIGHT else {}
    model = tvm.get_model(name, weights=None, **kwargs).train()
    size = SIZES.get(name, 64)

    def backward() -> None:
        target = torch.randint(0, 1000, (2,))
        _classification_loss(name, model(torch.randn(2, 3, size, size)), target).backward()

    return Case([model], backward, sgd([model]))


def _box_targets(size: int, masks: bool = False, keypoints: bool = False
                 ) -> list[dict[str, torch.Tensor]]:
    out = []
    for i in range(2):
        box = torch.tensor([[8.0 + 4 * i, 10.0, 60.0, 64.0 + 4 * i]])
        # a keypoint model has one class besides the background: the person
        target = {"boxes": box, "labels": torch.tensor([1 if keypoints else 1 + i])}
        if masks:
            mask = torch.zeros(1, size, size, dtype=torch.uint8)
            mask[0, 10:64, 8:60] = 1
            target["masks"] = mask
        if keypoints:
            xy = torch.rand(1, 17, 2) * 40 + 12
            target["keypoints"] = torch.cat([xy, torch.ones(1, 17, 1)], dim=-1)
        out.append(target)
    return out


#: detection model -> (image size, extra builder arguments)
DETECTION: dict[str, tuple[int, dict[str, Any]]] = {
    "fasterrcnn_mobilenet_v3_large_320_fpn": (128, {}),
    "fasterrcnn_resnet50_fpn": (128, {"min_size": 128, "max_size": 128}),
    "fasterrcnn_resnet50_fpn_v2": (128, {"min_size": 128, "max_size": 128}),
    "maskrcnn_resnet50_fpn": (128, {"min_size": 128, "max_size": 128}),
    "keypointrcnn_resnet50_fpn": (128, {"min_size": 128, "max_size": 128}),
    "retinanet_resnet50_fpn": (128, {"min_size": 128, "max_size": 128}),
    "fcos_resnet50_fpn": (128, {"min_size": 128, "max_size": 128}),
    "ssdlite320_mobilenet_v3_large": (128, {}),  # resized to 320 inside
}


def detection(name: str) -> Case:
    size, kwargs = DETECTION[name]
    classes = 2 if name.startswith("keypoint") else 3
    model = tvm.get_model(name, weights=None, weights_backbone=None, num_classes=classes,
                          **kwargs).train()
    targets = _box_targets(size, masks=name.startswith("mask"),
                           keypoints=name.startswith("keypoint"))

    def backward() -> None:
        images = [torch.rand(3, size, size) for _ in range(2)]
        losses = model(images, targets)
        sum(losses.values()).backward()

    return Case([model], backward, sgd([model]))


#: segmentation model -> whether it has an auxiliary head (trained with weight 0.5)
SEGMENTATION = {"fcn_resnet50": True, "deeplabv3_resnet50": True,
                "deeplabv3_mobilenet_v3_large": True, "lraspp_mobilenet_v3_large": False,
                "fcn_resnet101": True, "deeplabv3_resnet101": True}


def segmentation(name: str) -> Case:
    aux = SEGMENTATION[name]
    kwargs = {"aux_loss": True} if aux else {}
    model = tvm.get_model(name, weights=None, weights_backbone=None, num_classes=4,
                          **kwargs).train()

    def backward() -> None:
        out = model(torch.randn(2, 3, 64, 64))
        mask = torch.randint(0, 4, (2, 64, 64))
        loss = F.cross_entropy(out["out"], mask)
        if aux:
            loss = loss + 0.5 * F.cross_entropy(out["aux"], mask)
        loss.backward()

    return Case([model], backward, sgd([model]))


#: video model -> clip shape (channels, frames, height, width)
VIDEO = {"r3d_18": (3, 8, 64, 64), "mc3_18": (3, 8, 64, 64), "r2plus1d_18": (3, 8, 64, 64),
         "s3d": (3, 16, 224, 224),  # its last pooling is fixed at 2x7x7
         "swin3d_t": (3, 8, 64, 64),
         "mvit_v2_s": (3, 16, 224, 224)}  # its positional sizes are fixed at 16x224x224


def video(name: str) -> Case:
    model = tvm.get_model(name, weights=None, num_classes=10).train()
    shape = VIDEO[name]

    def backward() -> None:
        F.cross_entropy(model(torch.randn(2, *shape)), torch.randint(0, 10, (2,))).backward()

    return Case([model], backward, sgd([model]))


#: timm model -> (input size, builder arguments): small ViTs at 32x32 (img_size), stochastic
#: depth on where people turn it on
TIMM: dict[str, tuple[int, dict[str, Any]]] = {
    "vit_tiny_patch16_224": (32, {"img_size": 32, "patch_size": 8}),
    "deit_tiny_patch16_224": (32, {"img_size": 32, "patch_size": 8, "drop_path_rate": 0.1}),
    "convnext_atto": (64, {"drop_path_rate": 0.1}),
    "efficientnet_b0": (64, {"drop_path_rate": 0.2}),
    "mobilevitv2_050": (64, {}),
    "resnet18d": (64, {}),
}


def timm_model(name: str) -> Case:
    import timm

    size, kwargs = TIMM[name]
    model = timm.create_model(name, pretrained=False, num_classes=10, **kwargs).train()

    def backward() -> None:
        F.cross_entropy(model(torch.randn(2, 3, size, size)),
                        torch.randint(0, 10, (2,))).backward()

    return Case([model], backward, sgd([model]))


def _tiny(cls: Any, **kwargs: Any) -> Any:
    return cls(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
               intermediate_size=37, **kwargs)


def _hf_bert() -> tuple[nn.Module, Callable[[nn.Module], torch.Tensor]]:
    from transformers import BertConfig, BertForSequenceClassification

    model = BertForSequenceClassification(_tiny(BertConfig, vocab_size=100, num_labels=3))
    return model, lambda m: m(input_ids=torch.randint(1, 100, (2, 12)),
                              attention_mask=torch.ones(2, 12, dtype=torch.long),
                              labels=torch.randint(0, 3, (2,))).loss


def _hf_gpt2() -> tuple[nn.Module, Callable[[nn.Module], torch.Tensor]]:
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(vocab_size=100, n_positions=32, n_embd=32, n_layer=2,
                                       n_head=2))

    def loss(m: nn.Module) -> torch.Tensor:
        ids = torch.randint(0, 100, (2, 12))
        return m(input_ids=ids, labels=ids).loss  # type: ignore[no-any-return]

    return model, loss


def _hf_vit() -> tuple[nn.Module, Callable[[nn.Module], torch.Tensor]]:
    from transformers import ViTConfig, ViTForImageClassification

    model = ViTForImageClassification(_tiny(ViTConfig, image_size=32, patch_size=8,
                                            num_labels=10))
    return model, lambda m: m(pixel_values=torch.randn(2, 3, 32, 32),
                              labels=torch.randint(0, 10, (2,))).loss


def _hf_t5() -> tuple[nn.Module, Callable[[nn.Module], torch.Tensor]]:
    from transformers import T5Config, T5ForConditionalGeneration

    model = T5ForConditionalGeneration(T5Config(vocab_size=100, d_model=32, d_kv=8, d_ff=37,
                                                num_layers=2, num_heads=2,
                                                decoder_start_token_id=0))
    return model, lambda m: m(input_ids=torch.randint(1, 100, (2, 12)),
                              labels=torch.randint(1, 100, (2, 6))).loss


HF = {"bert": _hf_bert, "gpt2": _hf_gpt2, "vit": _hf_vit, "t5": _hf_t5}


def hf_model(name: str) -> Case:
    model, loss = HF[name]()
    model.train()
    return Case([model], lambda: loss(model).backward(), sgd([model]))
