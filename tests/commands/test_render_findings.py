"""``render`` outlines where ``check`` finds a problem: the boundary module's node or cluster,
or the node its module is folded into; steps drawn without one point at the step that has it.
Real sample runs, the real ``check`` and the real ``dot``."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from helpers import SAMPLES, Traced, hooktrace_cmd

OUTLINE = 'color="#c00000"'


@pytest.fixture(scope="module")
def logs(traced: Traced, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each sample's shared log, copied: the pictures are written beside it."""
    tmp = tmp_path_factory.mktemp("marked")
    return {name: Path(shutil.copy(traced(SAMPLES / f"{name}.py"), tmp / f"{name}.jsonl"))
            for name in ("detached_branch", "nan_layer", "dead_relu", "mnist_net")}


def rendered(log: Path, *args: str) -> tuple[str, str]:
    """(the DOT text, what render said) of ``hooktrace render ARGS``."""
    out = log.with_name(f"{log.stem}{len(args)}.dot")
    result = hooktrace_cmd("render", log, "--format", "dot", "-o", out, *args)
    assert result.returncode == 0, result.stderr
    return out.read_text(), result.stderr


def outlined(dot: str) -> list[str]:
    """The ids of the outlined nodes and clusters, in the order written."""
    found, cluster = [], ""
    for line in dot.splitlines():
        if opened := re.search(r'subgraph "?(cluster_[^" {]+)', line):
            cluster = opened.group(1)  # its attributes follow on the next line
        if OUTLINE in line:
            node = re.match(r'\s*"([^"]+)" \[', line)
            found.append(node.group(1) if node else cluster)
    return found


def test_the_boundary_cluster_is_outlined_with_its_kind(logs: dict[str, Path]) -> None:
    """detached_branch: check names (root), around the detached branch_b: the model's cluster
    carries the outline and the kind; the starved branch_b keeps its grey 'no backward'."""
    dot, said = rendered(logs["detached_branch"])
    assert "1 problem of check outlined" in said
    assert dot.count(OUTLINE) == 1
    cluster = next(line for line in dot.splitlines() if OUTLINE in line)
    assert "TwoBranch" in cluster and "no-grad" in cluster and "penwidth=2.5" in cluster
    assert "branch_b.0" in dot and "where hooktrace check finds a problem" in dot


def test_no_findings_draws_the_plain_picture(logs: dict[str, Path]) -> None:
    dot, said = rendered(logs["detached_branch"], "--no-findings")
    assert OUTLINE not in dot and "outlined" not in said
    assert "where hooktrace check finds a problem" not in dot


def test_a_healthy_run_has_no_outline(logs: dict[str, Path]) -> None:
    dot, said = rendered(logs["mnist_net"])
    assert OUTLINE not in dot and "outlined" not in said and "other steps" not in said


def test_a_step_without_the_problem_points_at_the_step_with_it(logs: dict[str, Path]) -> None:
    """nan_layer's NaN starts at step 3: the default picture (step 0) has no outline and says
    so; step 3 outlines compress (the first NaN output) and the model (its NaN gradient)."""
    dot, said = rendered(logs["nan_layer"])
    assert OUTLINE not in dot
    assert "check finds problems in other steps (3): --step 3 draws the first" in said
    dot, said = rendered(logs["nan_layer"], "--step", "3")
    assert "2 problems of check outlined" in said and "other steps" not in said
    assert outlined(dot) == ["cluster_m0/", "m0/compress#0"]
    compress = next(line for line in dot.splitlines() if line.lstrip().startswith('"m0/compress'))
    assert "nonfinite-forward" in compress
    assert "nonfinite-backward" not in compress


def test_a_folded_boundary_outlines_the_node_it_is_folded_into(logs: dict[str, Path]) -> None:
    """dead_relu names act2; drawn at depth 0 the whole model is one node, which is outlined;
    drawn in full, act2's own node is, and no other."""
    dot, _ = rendered(logs["dead_relu"])
    assert outlined(dot) == ["m0/act2#0"]
    assert "dead-activation" in next(line for line in dot.splitlines() if OUTLINE in line)
    dot, _ = rendered(logs["dead_relu"], "--depth", "0")
    assert outlined(dot) == ["m0/#0"]


def test_the_picture_is_laid_out_by_dot(logs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "nan.svg"
    result = hooktrace_cmd("render", logs["nan_layer"], "--step", "3", "-o", out)
    assert result.returncode == 0, result.stderr
    svg = out.read_text()
    assert svg.count('stroke="#c00000"') == 2 and "nonfinite&#45;forward" in svg
