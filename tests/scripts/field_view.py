"""Field programs for the view page's first sight (issue 47, item 5); one per CASE (argv[1]).
Each trains a seeded model on CPU for two steps and is healthy.

- ``resnet50``: torchvision's resnet50 (random weights), batch 2 at 64x64: 16 Bottleneck blocks
  in four layers.
- ``topk_gnn``: PyG's ``proteins_topk_pool.py`` written in plain torch: three blocks of a graph
  convolution (its ``lin_rel``, ``lin_root`` and sum aggregation are modules) and a top-k pooling
  (a ``select`` that scores and keeps the best 80% of each graph's nodes, a ``connect`` that
  keeps the edges between them), each block read out by max and mean pooling, then three
  Linear layers. The edge index and the batch vector flow from each pooling into the next
  block's every module: a hairball of edges at depth 2.
- ``mlp``: a four-layer MLP, the healthy look-alike: drawn whole as before.
"""

from __future__ import annotations

import sys

import torch
from torch import nn
from torch.nn import functional as F

torch.set_num_threads(1)
STEPS = 2


def resnet50() -> None:
    import torchvision

    model = torchvision.models.resnet50(weights=None, num_classes=10)
    fit(model, lambda: (torch.randn(2, 3, 64, 64),), torch.randint(0, 10, (2,)))


def fit(model: nn.Module, batch: object, y: torch.Tensor) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(STEPS):
        opt.zero_grad()
        loss = F.cross_entropy(model(*batch()), y)  # type: ignore[operator]
        loss.backward()
        opt.step()
        print(f"loss {loss.item():.4f}")


class SumAggregation(nn.Module):
    def forward(self, messages: torch.Tensor, index: torch.Tensor, nodes: int) -> torch.Tensor:
        return messages.new_zeros(nodes, messages.shape[1]).index_add_(0, index, messages)


class GraphConv(nn.Module):
    """PyG's ``GraphConv``: the neighbours' sum through ``lin_rel``, plus ``lin_root``."""

    def __init__(self, width_in: int, width: int) -> None:
        super().__init__()
        self.aggr_module = SumAggregation()
        self.lin_rel = nn.Linear(width_in, width)
        self.lin_root = nn.Linear(width_in, width, bias=False)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        summed = self.aggr_module(x[edge_index[0]], edge_index[1], x.shape[0])
        return self.lin_rel(summed) + self.lin_root(x)


class SelectTopK(nn.Module):
    """Scores each node (``tanh`` of its projection) and keeps the best ``ratio`` of each
    graph's nodes."""

    def __init__(self, width: int, ratio: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(1, width))
        self.ratio = ratio

    def forward(self, x: torch.Tensor, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        score = torch.tanh((x * self.weight).sum(-1) / self.weight.norm())
        keep = []
        for graph in range(int(batch.max()) + 1):
            nodes = (batch == graph).nonzero().flatten()
            best = score[nodes].topk(max(1, int(self.ratio * len(nodes)))).indices
            keep.append(nodes[best])
        perm = torch.cat(keep)
        return perm, score[perm]


class FilterEdges(nn.Module):
    """Keeps the edges between kept nodes, renumbered."""

    def forward(self, edge_index: torch.Tensor, perm: torch.Tensor, nodes: int) -> torch.Tensor:
        new = torch.full((nodes,), -1, dtype=torch.long)
        new[perm] = torch.arange(len(perm))
        kept = edge_index[:, (new[edge_index[0]] >= 0) & (new[edge_index[1]] >= 0)]
        return new[kept]


class TopKPooling(nn.Module):
    def __init__(self, width: int, ratio: float = 0.8) -> None:
        super().__init__()
        self.select = SelectTopK(width, ratio)
        self.connect = FilterEdges()

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor, batch: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        perm, score = self.select(x, batch)
        edge_index = self.connect(edge_index, perm, x.shape[0])
        return x[perm] * score.unsqueeze(-1), edge_index, batch[perm]


def readout(x: torch.Tensor, batch: torch.Tensor, graphs: int) -> torch.Tensor:
    """``cat([global_max_pool, global_mean_pool])``."""
    index = batch.unsqueeze(-1).expand_as(x)
    top = x.new_full((graphs, x.shape[1]), -1e9).scatter_reduce(0, index, x, "amax")
    mean = x.new_zeros(graphs, x.shape[1]).scatter_reduce(0, index, x, "mean",
                                                          include_self=False)
    return torch.cat([top, mean], dim=1)


class TopKNet(nn.Module):
    def __init__(self, features: int = 3, width: int = 32, classes: int = 2) -> None:
        super().__init__()
        self.conv1, self.pool1 = GraphConv(features, width), TopKPooling(width)
        self.conv2, self.pool2 = GraphConv(width, width), TopKPooling(width)
        self.conv3, self.pool3 = GraphConv(width, width), TopKPooling(width)
        self.lin1 = nn.Linear(2 * width, width)
        self.lin2 = nn.Linear(width, width // 2)
        self.lin3 = nn.Linear(width // 2, classes)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor, batch: torch.Tensor
                ) -> torch.Tensor:
        graphs = int(batch.max()) + 1
        found = []
        for conv, pool in ((self.conv1, self.pool1), (self.conv2, self.pool2),
                           (self.conv3, self.pool3)):
            x = F.relu(conv(x, edge_index))
            x, edge_index, batch = pool(x, edge_index, batch)
            found.append(readout(x, batch, graphs))
        x = F.relu(self.lin1(found[0] + found[1] + found[2]))
        x = F.dropout(x, p=0.5, training=self.training)
        return F.log_softmax(self.lin3(F.relu(self.lin2(x))), dim=-1)


def graphs(count: int = 4, nodes: int = 10) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``count`` random graphs of ``nodes`` nodes each, batched as PyG batches them."""
    edges = [torch.randint(0, nodes, (2, 3 * nodes)) + g * nodes for g in range(count)]
    batch = torch.arange(count).repeat_interleave(nodes)
    return torch.randn(count * nodes, 3), torch.cat(edges, dim=1), batch


def topk_gnn() -> None:
    model = TopKNet()
    data = graphs()
    y = torch.randint(0, 2, (4,))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(STEPS):
        opt.zero_grad()
        loss = F.nll_loss(model(*data), y)
        loss.backward()
        opt.step()
        print(f"loss {loss.item():.4f}")


def mlp() -> None:
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(),
                          nn.Linear(16, 3))
    fit(model, lambda: (torch.randn(4, 8),), torch.randint(0, 3, (4,)))


CASES = {"resnet50": resnet50, "topk_gnn": topk_gnn, "mlp": mlp}

if __name__ == "__main__":
    torch.manual_seed(0)
    CASES[sys.argv[1]]()
