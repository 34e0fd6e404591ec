"""The first sight of the field programs' pictures (tests/scripts/field_view.py, issue 47 item 5):
``render``'s automatic depth leaves no hairball (a top-k pooling graph network: before, 43 edges
between 18 nodes at depth 2), and the ``view`` page, in a real headless Chromium at 1400x1000,
shows each step's call graph at a readable size before any click (resnet50: before, its 22
blocks at depth 2 shrunk to 29%, 4 px labels), saying what it chose; healthy look-alikes keep
their pictures (resnet50 in ``render``, an MLP in ``view``)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from helpers import Traced, hooktrace_cmd

from hooktrace.log.reader import LogReader
from hooktrace.show.view.data import gather
from hooktrace.show.view.graphs import step_graphs
from hooktrace.show.view.page import LEAST_SCALE
from tests.commands.test_view import ARTIFACTS, graph_nodes

SCRIPT = Path(__file__).parent.parent / "scripts" / "field_view.py"
STEM = ["conv1", "bn1", "relu", "maxpool"]

needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="needs Graphviz dot")


def edges_header(log: Path) -> str:
    result = hooktrace_cmd("show", "--edges", log)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()[0]


def test_a_graph_network_is_drawn_by_its_blocks(traced: Traced) -> None:
    """Depth 2 draws the edge index and the batch vector into every convolution's and
    pooling's modules (41 forward edges between 18 nodes, 2.3 a node; 43 while a pooling's
    ``batch[perm]``, integers made with gradients on, was made by no call: the picture drew
    the pooling's inputs' makers for it, not its ``select``, whose ``perm`` indexes it): the
    automatic depth is 1, the three convolution and pooling blocks and the head, 12 edges."""
    log = traced(SCRIPT, "topk_gnn")
    assert edges_header(log) == ("step 0 (steps in the log: 0-1): model (TopKNet): depth 1 of "
                                 "2 (auto): 12 forward edges, 10 backward edges")
    deeper = hooktrace_cmd("show", "--edges", "--depth", "2", log)
    assert "depth 2 of 2: 41 forward edges" in deeper.stdout.splitlines()[0]


def test_render_keeps_resnet50_s_blocks(traced: Traced) -> None:
    """The look-alike: a chain of blocks is no hairball (21 edges between 22 nodes)."""
    assert edges_header(traced(SCRIPT, "resnet50")) == (
        "step 0 (steps in the log: 0-1): model (ResNet): depth 2 of 4 (auto): 21 forward edges, "
        "21 backward edges")


@needs_dot
def test_the_page_draws_what_fits_and_says_so(traced: Traced) -> None:
    """resnet50's first drawing is its stem, four layers and head (depth 1), and the summary
    says why; the drawing a click unfolds is depth 2's. An MLP, and the GNN at its automatic
    depth, fit as they are."""
    found = step_graphs(gather(LogReader(traced(SCRIPT, "resnet50"))), [])
    first = found["|0"]
    assert first["depth"] == 1 and "unfold" in first
    assert first["summary"] == ("10 nodes at depth 1 of 4; depth 2 (22 nodes) would show at "
                                "29% of its size: click a block to unfold it")
    for case, deepest, nodes in (("mlp", 1, 5), ("topk_gnn", 2, 9)):
        drawn = step_graphs(gather(LogReader(traced(SCRIPT, case))), [])["|0"]
        assert drawn["summary"] == f"{nodes} nodes at depth 1 of {deepest}"


def shown(driver: Any) -> dict[str, float]:
    """The call graph's SVG as the page shows it: its scale against its natural size (dot's
    points at 96 dpi), and whether the pane scrolls."""
    got: dict[str, float] = driver.execute_script(
        "const box = document.getElementById('graph'), svg = box.querySelector('svg');"
        "return {scale: svg.getBoundingClientRect().height / (svg.viewBox.baseVal.height * 4 / 3),"
        " scrolls: box.scrollHeight > box.clientHeight || box.scrollWidth > box.clientWidth};")
    return got


@pytest.mark.slow
@needs_dot
def test_resnet50_is_readable_before_any_click(traced: Traced, browser: Any,
                                               tmp_path: Path) -> None:
    """At 1400x1000 the first drawing is whole in its pane at 40% of its size or more (before:
    29%); a click on ``layer3`` unfolds its six blocks."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    page = tmp_path / "resnet50.html"
    result = hooktrace_cmd("view", "-o", page, traced(SCRIPT, "resnet50"))
    assert result.returncode == 0, result.stderr
    browser.get(page.as_uri())
    assert graph_nodes(browser) == [*STEM, "layer1", "layer2", "layer3", "layer4", "avgpool",
                                    "fc"]
    got = shown(browser)
    assert got["scale"] >= LEAST_SCALE and not got["scrolls"], got
    assert "would show at 29%" in browser.find_element(By.ID, "graph-summary").text
    ARTIFACTS.mkdir(exist_ok=True)
    assert browser.save_screenshot(str(ARTIFACTS / "view-resnet50.png"))
    browser.find_element(By.CSS_SELECTOR, '#graph g.node[data-fqn="layer3"]').click()
    WebDriverWait(browser, 10).until(lambda b: b.find_element(By.ID, "graph").get_attribute(
        "data-unfolded") == "layer3")
    outlined = [n.get_attribute("data-fqn") for n in browser.find_elements(
        By.CSS_SELECTOR, "#graph g.node.unfolded")]
    assert outlined == [f"layer3.{i}" for i in range(6)]


@pytest.mark.slow
@needs_dot
def test_a_graph_network_is_readable_before_any_click(traced: Traced, browser: Any,
                                                      tmp_path: Path) -> None:
    page = tmp_path / "gnn.html"
    result = hooktrace_cmd("view", "-o", page, traced(SCRIPT, "topk_gnn"))
    assert result.returncode == 0, result.stderr
    browser.get(page.as_uri())
    assert sorted(graph_nodes(browser)) == sorted([
        "conv1", "pool1", "conv2", "pool2", "conv3", "pool3", "lin1", "lin2", "lin3"])
    got = shown(browser)
    assert got["scale"] >= LEAST_SCALE and not got["scrolls"], got
    ARTIFACTS.mkdir(exist_ok=True)
    assert browser.save_screenshot(str(ARTIFACTS / "view-topk-gnn.png"))
