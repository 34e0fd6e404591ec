"""``hooktrace view``: the page in a real headless Chromium (loads from file:// with no console
error and no network request, the step selector redraws, hover shows a node's numbers, a click
unfolds a folded block, the rank selector, a screenshot), the heatmap's cells and pictures,
ranks, cut and NaN logs, bad input."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import ROOT, SAMPLES, hooktrace_cmd

from hooktrace.log.reader import LogReader
from hooktrace.show.view.data import gather
from hooktrace.show.view.heatmap import MARKS, heatmap

SCRIPTS = ROOT / "tests" / "scripts"
ARTIFACTS = ROOT / "artifacts"  # screenshots, ignored by git


def trace(tmp: Path, name: str, script: Path, *args: str) -> Path:
    log = tmp / f"{name}.jsonl"
    result = hooktrace_cmd("run", "-o", log, script, *args)
    assert result.returncode == 0, result.stderr
    return log


def view(log: Path | str, out: Path, *more: str) -> Path:
    result = hooktrace_cmd("view", log, "-o", out, *more)
    assert result.returncode == 0, result.stderr
    assert f"wrote {out}" in result.stderr
    return out


@pytest.fixture(scope="module")
def resnet18_page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("resnet18")
    log = tmp / "resnet18.jsonl"  # run from its folder: the page shows no path of this machine
    result = hooktrace_cmd("run", "-o", log, "resnet18_train.py", "3", cwd=SCRIPTS)
    assert result.returncode == 0, result.stderr
    return view(log, tmp / "view.html")


def requests(driver: Any) -> list[str]:
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


@pytest.mark.slow
def test_page_in_a_real_browser(resnet18_page: Path, browser: Any) -> None:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    url = resnet18_page.as_uri()
    browser.get("about:blank")
    requests(browser), browser.get_log("browser")  # what the browser did before: not the page's
    browser.get(url)
    errors = [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "WARNING")]
    assert errors == []
    assert [u for u in requests(browser) if u != url] == []

    def title() -> str:  # the picture's title, as dot split it into text elements
        return " ".join(t.text for t in browser.find_elements(
            By.CSS_SELECTOR, "#graph svg g.graph > text"))

    assert "step 0" in title()
    Select(browser.find_element(By.ID, "step")).select_by_value("2")
    assert "step 2" in title() and "step 0" not in title()

    node = next(n for n in browser.find_elements(By.CSS_SELECTOR, "#graph g.node")
                if n.get_attribute("data-fqn") == "fc")
    ActionChains(browser).move_to_element(node).perform()
    tip = browser.find_element(By.ID, "tip")
    assert tip.is_displayed()
    assert "fc · Linear" in tip.text and "grad_output norm" in tip.text
    assert re.search(r"\d\.\d+(e-?\d+)? \(max \|x\|", tip.text), tip.text
    assert "2x10 float32" in tip.text

    cells = browser.find_elements(By.CSS_SELECTOR, "table.heat td")
    assert len(cells) > 60 * 3
    ActionChains(browser).move_to_element(cells[5]).perform()
    assert "step" in tip.text and "1 call, 1 backward" in tip.text  # one call: not "1 calls"
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []


@pytest.mark.slow
def test_the_graph_fits_its_pane_at_first_sight(resnet18_page: Path, browser: Any) -> None:
    """At 1400x1000 resnet18's step is in sight whole, its title, head node, backward edges and
    legend behind no scrollbar: the drawing scaled down to the pane."""
    browser.get(resnet18_page.as_uri())
    got = browser.execute_script(
        "const box = document.getElementById('graph');"
        "const svg = box.querySelector('svg').getBoundingClientRect();"
        "return {scroll: [box.scrollWidth, box.scrollHeight], pane: [box.clientWidth,"
        " box.clientHeight], svg: [svg.right, svg.bottom], window: [window.innerWidth,"
        " window.innerHeight]};")
    assert got["scroll"][0] <= got["pane"][0] and got["scroll"][1] <= got["pane"][1], got
    assert got["svg"][0] <= got["window"][0] and got["svg"][1] <= got["window"][1], got


def graph_nodes(browser: Any) -> list[str]:
    from selenium.webdriver.common.by import By

    return [n.get_attribute("data-fqn") or "" for n in browser.find_elements(
        By.CSS_SELECTOR, "#graph g.node[data-fqn]")]


@pytest.mark.slow
def test_click_unfolds_a_folded_block(resnet18_page: Path, browser: Any) -> None:
    """resnet18 draws its blocks folded (depth 2); a click on layer2.0 shows the step one level
    deeper with the block's own nodes outlined, and "fold" goes back."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.actions.action_builder import ActionBuilder
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(resnet18_page.as_uri())
    folded = graph_nodes(browser)
    assert "layer2.0" in folded and "layer2.0.conv1" not in folded
    block = browser.find_element(By.CSS_SELECTOR, '#graph g.node[data-fqn="layer2.0"]')
    assert "unfoldable" in (block.get_attribute("class") or "")
    ActionChains(browser).move_to_element(block).perform()
    scrolled = browser.execute_script("return window.scrollY")
    ActionChains(browser).click().perform()
    WebDriverWait(browser, 10).until(lambda b: b.find_element(By.ID, "graph").get_attribute(
        "data-unfolded") == "layer2.0")
    unfolded = graph_nodes(browser)
    assert len(unfolded) > len(folded)
    assert {"layer2.0.conv1", "layer2.0.bn2", "layer2.0.downsample"} <= set(unfolded)
    outlined = [n.get_attribute("data-fqn") for n in browser.find_elements(
        By.CSS_SELECTOR, "#graph g.node.unfolded")]
    assert len(outlined) >= 5 and all(f.startswith("layer2.0.") for f in outlined), outlined
    assert "unfolded layer2.0" in browser.find_element(By.ID, "graph-summary").text
    assert browser.execute_script("return window.scrollY") == scrolled  # the page stays put
    browser.execute_script("window.scrollTo(0, 0)")  # the title in sight, for the picture
    conv = browser.find_element(By.CSS_SELECTOR, '#graph g.node[data-fqn="layer2.0.conv1"]')
    assert conv.is_displayed() and conv.location["y"] < 900
    # a node's numbers, pointed at from its right edge: the tip opens beside it, not over it
    box = browser.execute_script("return arguments[0].getBoundingClientRect()", conv)
    pointer = ActionBuilder(browser)  # at viewport coordinates: nothing scrolls
    pointer.pointer_action.move_to_location(int(box["right"]) - 4,
                                            int(box["top"] + box["height"] / 4))
    pointer.perform()
    tip = browser.find_element(By.ID, "tip")
    assert tip.is_displayed() and "layer2.0.conv1 · Conv2d" in tip.text
    assert tip.location["x"] >= conv.location["x"] + conv.size["width"]
    assert browser.execute_script("return window.scrollY") == 0
    ARTIFACTS.mkdir(exist_ok=True)  # docs/view.png is this picture
    assert browser.save_screenshot(str(ARTIFACTS / "view-resnet18.png"))
    assert (ARTIFACTS / "view-resnet18.png").stat().st_size > 50_000
    fold = browser.find_element(By.ID, "fold")
    assert fold.is_displayed() and "layer2.0" in fold.text
    fold.click()
    assert graph_nodes(browser) == folded and not fold.is_displayed()
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []


@pytest.mark.slow
def test_finding_click_selects_its_step_and_cell(tmp_path: Path, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    page = view(trace(tmp_path, "nan", SAMPLES / "nan_layer.py"), tmp_path / "nan.html")
    browser.get(page.as_uri())
    first = browser.find_element(By.CSS_SELECTOR, "#findings li")
    assert "[nonfinite-forward]" in first.text and "compress" in first.text
    data = page.read_text(encoding="utf-8").split('id="data">')[1].split("</script>", 1)[0]
    hint = json.loads(data.replace("<\\/", "</"))["findings"][0]["hint"]
    assert hint and f"hint: {hint}" in first.text
    first.click()
    assert browser.find_element(By.ID, "step").get_attribute("value") == "3"
    hit = browser.find_elements(By.CSS_SELECTOR, "#graph g.node.hit")
    assert [n.get_attribute("data-fqn") for n in hit] == ["compress"]
    flashed = browser.find_elements(By.CSS_SELECTOR, "table.heat td.flash")
    assert len(flashed) == 1 and flashed[0].text == "NaN"
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []


def test_heatmap_cells_of_a_nan_run(tmp_path: Path) -> None:
    """nan_layer: finite norms up to step 2, NaN from step 3; compress named by a finding."""
    log = trace(tmp_path, "nan", SAMPLES / "nan_layer.py")
    from hooktrace.check.checklog import run_checks

    heat = heatmap(gather(LogReader(log)), run_checks(log).findings)
    assert heat.steps == [0, 1, 2, 3, 4]
    row = heat.rows.index((0, "compress"))
    cells = heat.cells[row]
    assert all(c.log10 is not None and not c.text for c in cells[:3])
    assert [c.text for c in cells[3:]] == ["NaN", "NaN"]
    assert cells[3].finding and not cells[4].finding
    assert heat.rows[0] == (0, "")  # the root first: a module before those inside it


def test_long_run_shows_watched_anomalies_and_no_gradient(tmp_path: Path) -> None:
    log = trace(tmp_path, "long", SAMPLES / "long_run.py")
    heat = heatmap(gather(LogReader(log)))
    assert 1800 in heat.steps and 1800 in heat.watched
    marks = {c.text for row in heat.cells for c in row[heat.steps.index(1800):]}
    assert MARKS["nonfinite"][1] in marks
    detached = trace(tmp_path, "detached", SAMPLES / "detached_branch.py")
    heat = heatmap(gather(LogReader(detached)))
    row = heat.rows.index((0, "branch_b.0"))
    assert {c.text for c in heat.cells[row]} == {MARKS["no-grad"][1]}


@pytest.mark.parametrize("fmt", ["svg", "png"])
def test_static_heatmap_picture(tmp_path: Path, fmt: str) -> None:
    log = trace(tmp_path, "mnist", SAMPLES / "mnist_net.py")
    out = view(log, tmp_path / f"heat.{fmt}")
    data = out.read_bytes()
    if fmt == "png":
        assert data.startswith(b"\x89PNG")
    else:
        text = data.decode()
        assert "<svg" in text and "conv1 (Conv2d)" in text and "log10 grad_output norm" in text
        params = view(log, tmp_path / "params.svg", "--values", "params").read_text()
        assert "parameter&#45;gradient norm" in params


@pytest.mark.slow
def test_two_ranks_and_a_cut_log(tmp_path: Path) -> None:
    from commands.test_multirank import _torchrun

    assert _torchrun(tmp_path, 2).returncode == 0
    page = view(tmp_path / "ddp.rank*.jsonl", tmp_path / "ranks.html").read_text()
    blob = page.split('<script type="application/json" id="data">')[1].split("</script>")[0]
    assert [r["rank"] for r in json.loads(blob)["ranks"]] == [0, 1]
    log = tmp_path / "ddp.rank0.jsonl"
    data = log.read_bytes()
    cut = tmp_path / "cut.jsonl"
    cut.write_bytes(data[: len(data) * 2 // 3])
    result = hooktrace_cmd("view", cut, "-o", tmp_path / "cut.html")
    assert result.returncode == 0 and "no end record" in result.stderr


@pytest.mark.parametrize("fmt", ["html", "svg", "png"])
def test_a_cut_log_warns_in_every_format(tmp_path: Path, fmt: str) -> None:
    data = trace(tmp_path, "mnist", SAMPLES / "mnist_net.py").read_bytes()
    cut = tmp_path / "cut.jsonl"
    cut.write_bytes(data[: len(data) * 2 // 3])
    result = hooktrace_cmd("view", cut, "--format", fmt, "-o", tmp_path / f"cut.{fmt}")
    assert result.returncode == 0, result.stderr
    assert "warning: " in result.stderr and "no end record" in result.stderr


@pytest.mark.slow
def test_rank_selector_draws_the_other_rank(tmp_path: Path, browser: Any) -> None:
    """Rank 1 takes a detour through `extra` at step 2: choosing rank 1 draws it in the graph
    and the heatmap; --rank 1 opens the page there."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    from commands.test_multirank import _torchrun

    result = _torchrun(tmp_path, 2, "--diverge", "1")
    assert result.returncode == 0, result.stderr
    logs = tmp_path / "ddp.rank*.jsonl"

    def rows() -> list[str]:
        return [th.text for th in browser.find_elements(By.CSS_SELECTOR, "table.heat tbody th")]

    browser.get(view(logs, tmp_path / "ranks.html").as_uri())
    assert Select(browser.find_element(By.ID, "rank")).first_selected_option.text == "rank 0"
    Select(browser.find_element(By.ID, "step")).select_by_value("2")
    assert "extra" not in graph_nodes(browser) and not any("extra" in r for r in rows())
    cells = browser.find_elements(By.CSS_SELECTOR, "table.heat td")
    assert cells and all(c.get_attribute("id").startswith("h0-") for c in cells)
    Select(browser.find_element(By.ID, "rank")).select_by_value("1")
    assert browser.find_element(By.ID, "step").get_attribute("value") == "2"
    assert "extra" in graph_nodes(browser) and any("extra" in r for r in rows())
    cells = browser.find_elements(By.CSS_SELECTOR, "table.heat td")
    assert cells and all(c.get_attribute("id").startswith("h1-") for c in cells)

    browser.get(view(logs, tmp_path / "rank1.html", "--rank", "1").as_uri())
    assert Select(browser.find_element(By.ID, "rank")).first_selected_option.text == "rank 1"
    assert all(c.get_attribute("id").startswith("h1-") for c in browser.find_elements(
        By.CSS_SELECTOR, "table.heat td"))
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []


def test_page_is_self_contained(tmp_path: Path) -> None:
    log = trace(tmp_path, "mnist", SAMPLES / "mnist_net.py")
    page = view(log, tmp_path / "mnist.html").read_text()
    assert not re.search(r"""(src|href)=["']?(https?:|//)""", page)
    assert "<script src" not in page and "@import" not in page
    assert "</script>" not in page.split('id="data">')[1].split("</script>", 1)[0]


@pytest.mark.parametrize("case", ["missing", "not a log", "over the log", "format", "empty",
                                  "directory", "rank html", "rank svg"])
def test_bad_input_is_one_line_and_exit_2(case: str, tmp_path: Path) -> None:
    good = trace(tmp_path, "mnist", SAMPLES / "mnist_net.py", "--steps", "1")
    (tmp_path / "empty.jsonl").write_bytes(b"")
    args: list[str | Path] = {
        "missing": [tmp_path / "nope.jsonl"],
        "empty": [tmp_path / "empty.jsonl"],
        "directory": [tmp_path],
        "rank html": [good, "--rank", "9", "-o", tmp_path / "x.html"],
        "rank svg": [good, "--rank", "9", "-o", tmp_path / "x.svg"],
        "not a log": [SAMPLES / "mnist_net.py"],
        "over the log": [good, "-o", good],
        "format": [good, "--format", "gif"],
    }[case]
    result = hooktrace_cmd("view", *args)
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


def test_view_and_the_notebook_heatmap_do_not_import_torch(tmp_path: Path) -> None:
    """write_view, and heatmap_picture as Jupyter shows it inline (_repr_svg_: SVG text)."""
    log = trace(tmp_path, "mnist", SAMPLES / "mnist_net.py", "--steps", "1")
    code = ("import sys; from hooktrace.show.view import heatmap_picture, write_view; "
            f"write_view([{str(log)!r}], {str(tmp_path / 'v.html')!r}); "
            f"sys.stdout.write(heatmap_picture({str(log)!r})._repr_svg_()); "
            "assert 'torch' not in sys.modules")
    result = subprocess.run([sys.executable, "-c", code], check=True, timeout=120,
                            capture_output=True, text=True)
    svg = result.stdout
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg and svg.rstrip().endswith("</svg>")
    assert "conv1 (Conv2d)" in svg and "log10 grad_output norm" in svg


def test_hover_says_where_the_forward_is(tmp_path: Path) -> None:
    """A node's details name the file and line of its class's forward (a class of the user's)."""
    from hooktrace.show.steplog import load_step
    from hooktrace.show.view.graphs import _graph

    log = trace(tmp_path, "quantize", SCRIPTS / "flow_bugs.py", "zero_grad_function")
    nodes = _graph(load_step(log, 0), [])["nodes"]
    [quantize] = [d for d in nodes.values() if d["class"] == "Quantize"]
    assert quantize["forward"].rsplit("/", 1)[-1].startswith("flow_bugs.py:")
    assert not [d for d in nodes.values() if d["class"] == "Linear" and "forward" in d]


def test_findings_say_where_as_check_does(tmp_path: Path) -> None:
    """The page's list of findings names each one's place with check's own words, also where a
    finding has no module ("(root)") or no model."""
    log = trace(tmp_path, "nan", SAMPLES / "nan_layer.py")
    page = view(log, tmp_path / "nan.html").read_text()
    data = json.loads(page.split('id="data">')[1].split("</script>", 1)[0])
    text = hooktrace_cmd("check", log).stdout
    places = [line.split("] ", 1)[1] for line in text.splitlines()
              if line.startswith("  [")]
    assert [f["where"] for f in data["findings"]] == places
    assert places and all(" · model 'model' · " in p for p in places)
