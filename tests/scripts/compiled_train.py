"""A tiny nanoGPT-shaped model trained compiled: embeddings, causal self-attention, an MLP, a
tied head, AdamW. Prints each step's loss, then torch._dynamo's counters as one JSON line.

    compiled_train.py [--how model|method|function|eager] [--backend aot_eager|inductor]
                      [--steps N] [--bug detach|nan|mask] [--nan-step K] [--model gpt|mlp|resnet18]
                      [--fullgraph] [--mode MODE]

``--how model``: ``torch.compile(model)``; ``method``: ``model.compile()``; ``function``: a
compiled training-step function that calls the model; ``eager``: not compiled.

``--bug detach``: the attention's output is ``.detach()``ed inside the compiled model; ``nan``:
the first weight of the last block's first MLP Linear is set to NaN before step ``--nan-step``
(14); ``mask``: from step ``--nan-step`` on, the first block's attention mask hides every key
(NaN from a softmax over -inf), and the loop skips the optimizer step of a loss that is not
finite, as many training loops do.

``--model mlp``: an embedding and an MLP instead (compiles faster); ``--model resnet18``:
torchvision's resnet18 (BatchNorm, in-place ReLU) on 64x64 images, 10 classes.
``--fullgraph``: compiled with ``fullgraph=True, dynamic=True``. ``--mode``: inductor with
that mode of ``torch.compile`` (``max-autotune-no-cudagraphs``).
"""

import argparse
import json
import math

import torch
import torch.nn.functional as F
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--how", default="model", choices=["model", "method", "function", "eager"])
parser.add_argument("--backend", default="aot_eager")
parser.add_argument("--steps", type=int, default=4)
parser.add_argument("--bug", choices=["detach", "nan", "mask"])
parser.add_argument("--nan-step", type=int, default=14, help="--bug nan: the step it starts at")
parser.add_argument("--model", default="gpt", choices=["gpt", "mlp", "resnet18"])
parser.add_argument("--fullgraph", action="store_true", help="fullgraph=True, dynamic=True")
parser.add_argument("--mode", help="inductor with this mode (max-autotune-no-cudagraphs)")
args = parser.parse_args()

VOCAB, BLOCK, EMBED, HEADS = 32, 8, 16, 2


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(EMBED, 3 * EMBED)
        self.proj = nn.Linear(EMBED, EMBED)
        self.register_buffer("mask", torch.tril(torch.ones(BLOCK, BLOCK)).view(1, 1, BLOCK, BLOCK))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(EMBED, dim=2)
        q, k, v = (z.view(b, t, HEADS, c // HEADS).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
        att = att.masked_fill(self.mask[:, :, :t, :t] == 0, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        return self.proj(y)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(EMBED)
        self.attn = Attention()
        self.ln_2 = nn.LayerNorm(EMBED)
        self.mlp = nn.Sequential(nn.Linear(EMBED, 4 * EMBED), nn.GELU(),
                                 nn.Linear(4 * EMBED, EMBED))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.attn(self.ln_1(x))
        if args.bug == "detach":
            a = a.detach()  # the bug: no gradient reaches ln_1 and attn
        x = x + a
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Embedding(VOCAB, EMBED)
        self.wpe = nn.Embedding(BLOCK, EMBED)
        self.h = nn.ModuleList([Block(), Block()])
        self.ln_f = nn.LayerNorm(EMBED)
        self.lm_head = nn.Linear(EMBED, VOCAB, bias=False)
        self.wte.weight = self.lm_head.weight  # tied

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.size(1))
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


graph_calls = [0]  # calls of the compiled graphs: the steps that ran compiled


def counting(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]):
    from torch._dynamo import lookup_backend

    if args.mode:  # what torch.compile(mode=...) builds around inductor
        compiled = torch._TorchCompileInductorWrapper(args.mode, None, None)(gm, example_inputs)
    else:
        compiled = lookup_backend(args.backend)(gm, example_inputs)

    def run(*inputs):
        graph_calls[0] += 1
        return compiled(*inputs)
    return run


torch.manual_seed(0)
if args.model == "gpt":
    model = GPT()
elif args.model == "mlp":
    model = nn.Sequential(nn.Embedding(VOCAB, EMBED), nn.Linear(EMBED, 4 * EMBED), nn.GELU(),
                          nn.Linear(4 * EMBED, VOCAB))
else:
    import torchvision

    model = torchvision.models.resnet18(num_classes=10)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
run = model
options = {"fullgraph": True, "dynamic": True} if args.fullgraph else {}
if args.how == "model":
    run = torch.compile(model, backend=counting, **options)
elif args.how == "method":
    model.compile(backend=counting, **options)


def loss_of(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    logits = run(x)
    return F.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1))


step_loss = loss_of
if args.how == "function":
    step_loss = torch.compile(loss_of, backend=counting, **options)
data = torch.randint(0, VOCAB, (args.steps, 4, BLOCK + 1))
images = torch.randn(args.steps, 4, 3, 64, 64)
for i in range(args.steps):
    if args.bug == "nan" and i == args.nan_step:
        with torch.no_grad():
            layer = model.h[1].mlp[0] if args.model == "gpt" else model[1]
            layer.weight[0, 0] = float("nan")
    if args.bug == "mask" and i == args.nan_step:
        model.h[0].attn.mask.zero_()
    if args.model == "resnet18":
        loss = step_loss(images[i], data[i, :, 0] % 10)
    else:
        loss = step_loss(data[i, :, :-1], data[i, :, 1:])
    optimizer.zero_grad()
    loss.backward()
    if args.bug != "mask" or torch.isfinite(loss):
        optimizer.step()
    print(f"step {i} loss {loss.item():.6f}")

counters = {}
if args.how != "eager":
    from torch._dynamo.utils import counters as dynamo

    counters = {"frames": dict(dynamo["frames"]), "stats": dict(dynamo["stats"]),
                "recompiles": sum(dynamo["recompiles"].values()), "graph_calls": graph_calls[0]}
print("counters " + json.dumps(counters, sort_keys=True))
