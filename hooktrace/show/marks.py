"""Which boxes of a drawn step each of ``check``'s findings belongs to.

A finding names the module where its problem happens (the boundary). In a drawing of one step
that module is a node (each of its calls), a cluster (a call with calls inside it), or, folded
by ``--depth``, inside the node of its ancestor at that depth. ``render`` outlines those boxes
and the view page lists the findings when a node is hovered; both ask here. Standard library
only: no torch.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from hooktrace.check.findings import Finding
from hooktrace.log.names import ancestors
from hooktrace.show.picture import NodeKey, View
from hooktrace.show.steplog import ModuleKey

Box = ModuleKey | NodeKey  # a cluster's key (model, fqn) or a node's (model, fqn, call)


def applies(finding: Finding, step: int) -> bool:
    """Whether ``finding`` is about ``step``: found there, in every step (``step`` None), or
    seen there again (its evidence's ``steps``)."""
    seen = finding.evidence.get("steps")
    return (finding.step is None or finding.step == step
            or (isinstance(seen, list) and step in seen))


def marks(view: View, findings: Sequence[Finding]) -> dict[Box, list[Finding]]:
    """The findings of ``view``'s step, by the boxes that show their boundary module; a
    module that is not drawn (never called in the step) gets none."""
    nodes: dict[ModuleKey, list[NodeKey]] = defaultdict(list)
    for key in view.node_map:
        nodes[key[0], key[1]].append(key)
    by_name = {name: model for model, name in view.log.models.items()}
    found: dict[Box, list[Finding]] = defaultdict(list)
    for finding in findings:
        model = by_name.get(finding.model)
        if model is None or not applies(finding, view.log.step):
            continue
        for box in _boxes(view, nodes, (model, finding.module)):
            found[box].append(finding)
    return dict(found)


def _boxes(view: View, nodes: dict[ModuleKey, list[NodeKey]], module: ModuleKey
           ) -> Sequence[Box]:
    if module in view.clusters:
        return [module]
    if module in nodes:
        return nodes[module]
    model, fqn = module
    for outer in reversed(ancestors(fqn)):  # folded into the node of the nearest ancestor
        folded = [key for key in nodes.get((model, outer), []) if view.node_map[key].folded]
        if folded or (model, outer) in view.clusters:
            return folded
    return []
