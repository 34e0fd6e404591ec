"""``hooktrace render``: golden DOT, the real ``dot`` program, depth folding, bad input.

Goldens live in tests/golden/; after an intended change regenerate them with
``HOOKTRACE_REGEN_GOLDEN=1 python -m pytest tests/test_render.py tests/test_show.py`` and review
the diff.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
import threading
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from helpers import assert_golden, hooktrace_cmd, run_sample
from torch import nn

import hooktrace
from hooktrace.cli import cli
from hooktrace.log import schema
from hooktrace.log.words import printable
from hooktrace.log.writer import LogWriter
from hooktrace.show import steplog
from hooktrace.show.graph import build
from hooktrace.show.picture import View
from hooktrace.show.render import picture, render, write_picture
from hooktrace.show.render.dot import TIMES, node_state, norm_text

ODD_NAMES = ['q"uote', "<lt>", "a&b", "{brace}", "p|ipe", "back\\slash", "new\nline", "end\\"]


class Branchy(nn.Module):
    """A residual, a module called twice, a detached branch and a no_grad branch."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(4, 8)
        self.act = nn.ReLU()
        self.block = nn.Sequential(nn.Linear(8, 8), nn.Tanh())
        self.side = nn.Linear(8, 8)
        self.frozen = nn.Linear(8, 8)
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.stem(x))
        h = h + self.block(h)
        h = h + self.side(h).detach()  # runs with gradients on, gets no backward
        with torch.no_grad():
            self.frozen(h)
        return self.head(self.act(h))


def odd_model() -> nn.Module:
    inner = nn.Sequential()
    for name in ODD_NAMES:
        inner.add_module(name, nn.Linear(3, 3))
    model = nn.Sequential()
    model.add_module('<outer "x">', inner)
    model.add_module("node", nn.Tanh())  # a DOT keyword
    return model


@pytest.fixture(scope="module")
def mnist_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    log = tmp_path_factory.mktemp("mnist") / "mnist.jsonl"
    run_sample(log, "mnist_net.py", "--steps", "2")
    return log


@pytest.fixture(scope="module")
def branchy_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    log = tmp_path_factory.mktemp("branchy") / "branchy.jsonl"
    torch.manual_seed(0)
    model = Branchy()
    with hooktrace.trace(log, model=model):
        model(torch.randn(2, 4)).sum().backward()
    return log


@pytest.fixture(scope="module")
def odd_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    log = tmp_path_factory.mktemp("odd") / "odd.jsonl"
    model = odd_model()
    with hooktrace.trace(log, model=model):
        model(torch.randn(2, 3)).sum().backward()
    return log


@pytest.fixture(scope="module")
def resnet50_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torchvision = pytest.importorskip("torchvision")
    log = tmp_path_factory.mktemp("resnet50") / "resnet50.jsonl"
    torch.manual_seed(0)
    model = torchvision.models.resnet50(weights=None)
    with hooktrace.trace(log, model=model):
        model(torch.randn(1, 3, 224, 224))[0, 0].backward()
    return log


def view_of(log: Path, depth: int | None = None, phase: str = "both") -> View:
    return build(steplog.load_step(log), depth, phase)


def edges_of(view: View) -> list[tuple[str, int, str, str]]:
    return [(e.phase, e.order, e.src[1], e.dst[1]) for e in view.edges()]


def without_dataflow(log: Path, out: Path) -> Path:
    """``log`` as a hooktrace from before data flow wrote it: no ``dataflow`` in the header,
    no ``from`` or ``made`` in the events."""
    lines = []
    for line in log.read_text(encoding="utf-8").splitlines():
        d = json.loads(line)
        for key in ("dataflow", "from", "made"):
            d.pop(key, None)
        lines.append(json.dumps(d, separators=(",", ":")) + "\n")
    out.write_text("".join(lines), encoding="utf-8")
    return out


def write_log(path: Path, events: list[schema.Record], end: bool = True) -> Path:
    """A log written by the real writer from hand-made records: model 0 is a Sequential of two."""
    writer = LogWriter(path)
    writer.write(schema.Header(schema=schema.SCHEMA_VERSION, hooktrace="0.1.0"))
    writer.write(schema.Model(model=0, name="net", cls="Sequential"))
    for name, cls in (("", "Sequential"), ("0", "Linear"), ("1", "Tanh")):
        writer.write(schema.Module(model=0, fqn=name, cls=cls))
    for record in events:
        writer.write(record)
    if end:
        writer.write(schema.End(status="ok"))
    writer.close()
    return path


def chain_step(step: int, seq: int, backward: bool = True) -> list[schema.Record]:
    """One step of the Sequential: forward 0, 1, root; then backward root, 1, 0."""
    fwd = [schema.ForwardEvent(seq + i, step, 0, name, 0, [[2, 3]], ["float32"], [[2, 3]],
                               ["float32"]) for i, name in enumerate(["0", "1", ""])]
    if not backward:
        return list(fwd)
    bwd = [schema.BackwardEvent(seq + 3 + i, step, 0, name, 0, seq + 2 - i, 1, 1, [[2, 3]],
                                [[2, 3]]) for i, name in enumerate(["", "1", "0"])]
    return [*fwd, *bwd, schema.Step(step, 3, 3)]


# -- what the picture holds -------------------------------------------------------------------


def test_mnist_golden_dot(mnist_log: Path) -> None:
    assert_golden("mnist.dot", picture(mnist_log).source)


def test_mnist_forward_chain_and_reversed_backward(mnist_log: Path) -> None:
    view = view_of(mnist_log)
    assert (view.log.step, view.depth, view.auto_depth) == (0, 1, True)
    chain = ["conv1", "conv2", "dropout1", "fc1", "dropout2", "fc2"]
    assert [n.key[1] for n in view.nodes()] == chain
    pairs = list(itertools.pairwise(chain))
    assert edges_of(view) == [
        *[("forward", i, a, b) for i, (a, b) in enumerate(pairs, 1)],
        *[("backward", i, b, a) for i, (a, b) in enumerate(reversed(pairs), 1)],
    ]
    assert all(e.mirrored and (e.grad_input_len, e.grad_output_len) == (1, 1)
               for e in view.edges() if e.phase == "backward")
    assert [key[1] for key, _ in view.backward_starts] == ["fc2"]


def test_branching_model_golden_dot(branchy_log: Path) -> None:
    assert_golden("branchy.dot", picture(branchy_log).source)


def test_branching_model_nodes_edges_and_states(branchy_log: Path, tmp_path: Path) -> None:
    """The edges follow the data: the residual sum (act, block.1) feeds side, frozen and the
    second act; side's output is detached and frozen's is made under no_grad: no edge leaves
    them, and no gradient comes back along the edges into them. The same log without data
    flow (as written before it) is drawn in call order, as then."""
    view = view_of(branchy_log)
    assert [n.key[1:] for n in view.nodes()] == [
        ("stem", 0), ("act", 0), ("block.0", 0), ("block.1", 0), ("side", 0), ("frozen", 0),
        ("act", 1), ("head", 0)]
    assert {n.key[1:]: node_state(n, view.checked) for n in view.nodes()} == {
        ("stem", 0): "ok", ("act", 0): "ok", ("block.0", 0): "ok", ("block.1", 0): "ok",
        ("side", 0): "no backward", ("frozen", 0): "no_grad", ("act", 1): "ok",
        ("head", 0): "ok"}
    assert view.dataflow
    assert [(e.phase, e.order, e.src[1:], e.dst[1:]) for e in view.edges()] == [
        ("forward", 1, ("stem", 0), ("act", 0)), ("forward", 2, ("act", 0), ("block.0", 0)),
        ("forward", 3, ("block.0", 0), ("block.1", 0)), ("forward", 4, ("act", 0), ("side", 0)),
        ("forward", 5, ("block.1", 0), ("side", 0)), ("forward", 6, ("act", 0), ("frozen", 0)),
        ("forward", 7, ("block.1", 0), ("frozen", 0)), ("forward", 8, ("act", 0), ("act", 1)),
        ("forward", 9, ("block.1", 0), ("act", 1)), ("forward", 10, ("act", 1), ("head", 0)),
        ("backward", 1, ("head", 0), ("act", 1)), ("backward", 2, ("act", 1), ("block.1", 0)),
        ("backward", 3, ("block.1", 0), ("block.0", 0)),
        ("backward", 4, ("act", 1), ("act", 0)), ("backward", 5, ("block.0", 0), ("act", 0)),
        ("backward", 6, ("act", 0), ("stem", 0))]
    assert all(e.mirrored for e in view.edges())
    assert [type(x).__name__ for x in view.inside((0, ""))] == [
        "Node", "Node", "Cluster", "Node", "Node", "Node", "Node"]
    dot = picture(branchy_log).source
    assert "call 1/2" in dot and "call 2/2" in dot
    assert not re.search(r"penwidth=2[ \]]", dot)  # no backward edge without its forward
    old = without_dataflow(branchy_log, tmp_path / "old.jsonl")
    view = view_of(old)
    assert not view.dataflow
    backward = [(e.src[1:], e.dst[1:], e.mirrored) for e in view.edges()
                if e.phase == "backward"]
    assert backward == [
        (("head", 0), ("act", 1), True),
        (("act", 1), ("block.1", 0), False),  # forward went block.1 -> side -> frozen -> act
        (("block.1", 0), ("block.0", 0), True),
        (("block.0", 0), ("act", 0), True),
        (("act", 0), ("stem", 0), True)]
    dot = picture(old).source
    assert "call 1/2" in dot and "call 2/2" in dot and re.search(r"penwidth=2[ \]]", dot)
    assert "forward: calls in execution order" in dot


def test_phase_forward_or_backward_only(branchy_log: Path) -> None:
    forward = view_of(branchy_log, phase="forward")
    assert {e.phase for e in forward.edges()} == {"forward"} and not forward.checked
    assert forward.backward_starts == []
    backward = view_of(branchy_log, phase="backward")
    assert {e.phase for e in backward.edges()} == {"backward"} and len(backward.edges()) == 6


def test_same_log_gives_the_same_dot_bytes(branchy_log: Path, tmp_path: Path) -> None:
    first = picture(branchy_log).source
    assert picture(branchy_log).source == first
    for seed in ("1", "2"):  # another process, another hash seed: no set or id() order leaks
        out = tmp_path / f"seed{seed}.dot"
        done = hooktrace_cmd("render", branchy_log, "-o", out,
                             env={**os.environ, "PYTHONHASHSEED": seed})
        assert done.returncode == 0, done.stderr
        assert out.read_text(encoding="utf-8") == first


def test_several_models_and_model_option(tmp_path: Path) -> None:
    log = tmp_path / "two.jsonl"
    gen = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
    disc = nn.Sequential(nn.Linear(4, 1))
    with hooktrace.trace(log, model=[gen, disc]):
        disc(gen(torch.randn(2, 4)).detach()).sum().backward()
    view = view_of(log)
    assert {n.key[0] for n in view.nodes()} == {0, 1}
    assert [node_state(n, view.checked) for n in view.nodes()] == ["no backward"] * 2 + ["ok"]
    only = build(steplog.load_step(log, model="disc"))
    assert [n.key for n in only.nodes()] == [(1, "0", 0)]
    runner = CliRunner()
    result = runner.invoke(cli, ["render", str(log), "--model", "critic"])
    assert result.exit_code == 2
    assert result.stderr == (f"hooktrace: error: no model 'critic' in {log}; "
                             "its models: 'disc', 'gen'\n")


def test_default_step_is_the_first_with_a_backward(tmp_path: Path) -> None:
    log = write_log(tmp_path / "steps.jsonl",
                    [*chain_step(0, 1, backward=False), *chain_step(1, 10), *chain_step(2, 20)])
    loaded = steplog.load_step(log)
    assert (loaded.step, loaded.steps) == (1, [0, 1, 2])
    assert {e.step for e in loaded.events} == {1}  # only the chosen step is kept
    assert [e.seq for e in steplog.load_step(log, step=2).events] == list(range(20, 26))


def test_long_log_keeps_only_the_chosen_step(tmp_path: Path) -> None:
    """Steps read past quickly keep their numbers; a call's backward in a later step is known
    in the step of the call; a flagged event among plain ones keeps its place."""
    events = [record for step in range(300) for record in chain_step(step, 10 * step + 1)]
    events.insert(6, schema.ForwardEvent(7, 0, 0, "1", 1, no_grad=True))  # after step 0's
    late = schema.BackwardEvent(10 * 300, 299, 0, "0", 0, 2981, 1, 1)  # of a call in step 298
    log = write_log(tmp_path / "long.jsonl", [*events[:-1], late, events[-1]])
    loaded = steplog.load_step(log)
    assert (loaded.step, loaded.steps) == (0, list(range(300)))
    assert [(e.seq, e.phase) for e in loaded.events] == [
        *((seq, "forward") for seq in (1, 2, 3)), *((seq, "backward") for seq in (4, 5, 6)),
        (7, "forward")]
    assert [e.seq for e in steplog.load_step(log, step=298, model="net").events] == list(
        range(2981, 2987))
    assert steplog.load_step(log, 298).later == {2981: 299}
    assert picture(log, step=297).source == picture(log, step=296).source.replace(
        "step 296", "step 297")


def test_view_graph_is_the_view_for_networkx(branchy_log: Path) -> None:
    view = view_of(branchy_log)
    graph = view.graph
    assert sorted(graph.nodes) == sorted(n.key for n in view.nodes())
    assert all(graph.nodes[n.key]["node"] is n for n in view.nodes())
    assert sorted((e.phase, e.order) for e in view.edges()) == sorted(
        key for _, _, key in graph.edges(keys=True))
    tree = view.tree
    for cluster in [None, *view.clusters]:
        inside = [x.key for x in view.inside(cluster)]
        if cluster is None:
            assert sorted(inside) == sorted(k for k, n in tree.in_degree() if n == 0)
        else:
            assert sorted(inside) == sorted(tree.successors(cluster))


# -- the real dot program ---------------------------------------------------------------------


def svg_texts(path: Path) -> list[str]:
    root = ET.parse(path).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    return [e.text or "" for e in root.iter("{http://www.w3.org/2000/svg}text")]


def test_cli_writes_svg_next_to_the_log(mnist_log: Path) -> None:
    done = hooktrace_cmd("render", mnist_log)
    assert done.returncode == 0, done.stderr
    out = mnist_log.with_suffix(".svg")
    assert done.stderr == (f"hooktrace: wrote {out}: step 0, depth 1 (auto): 6 modules, "
                           "10 edges (5 forward, 5 backward)\n")
    texts = svg_texts(out)
    for name in ["conv1", "conv2", "dropout1", "fc1", "dropout2", "fc2", "legend"]:
        assert name in texts


def test_png_and_pdf(branchy_log: Path, tmp_path: Path) -> None:
    png = write_picture(branchy_log, tmp_path / "b.png")
    pdf = write_picture(branchy_log, tmp_path / "b.out", "pdf")
    assert (png.format, pdf.format) == ("png", "pdf")
    assert (tmp_path / "b.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "b.out").read_bytes()[:5] == b"%PDF-"


def test_odd_module_names_are_escaped(odd_log: Path, tmp_path: Path) -> None:
    source = picture(odd_log).source
    assert "\n" not in "".join(line for line in source.splitlines())  # no raw newline in a label
    out = write_picture(odd_log, tmp_path / "odd.svg").path
    texts = svg_texts(out)  # the real dot made it, and it parses as XML
    for name in ODD_NAMES:
        assert f'<outer "x">.{printable(name)}' in texts
    assert '<outer "x">.new\\nline' in texts and "node" in texts


def test_notebook_object(branchy_log: Path) -> None:
    class Session:  # what hooktrace.trace() returns: anything with .path
        path = branchy_log

    shown = render(Session())
    assert shown.source.startswith("digraph hooktrace {")
    svg = shown._repr_svg_()
    assert "<svg" in svg and "block.0" in svg


def test_writes_into_a_pipe_without_replacing_it(branchy_log: Path, tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
    reader.start()
    write_picture(branchy_log, fifo, "dot")
    reader.join(10)
    assert received == [picture(branchy_log).source.encode()]
    assert fifo.is_fifo()


# -- resnet50: depth folding and dot's time ---------------------------------------------------


@pytest.mark.slow
def test_resnet50_depth_folding(resnet50_log: Path) -> None:
    counts = {depth: view_of(resnet50_log, depth=depth).graph.number_of_nodes()
              for depth in range(6)}
    # 0: the model; 1: stem, 4 layers, avgpool, fc; 2: 16 Bottlenecks; 3: their 9-10 calls;
    # 4: the 4 downsample Sequentials unfold into conv + bn
    assert counts == {0: 1, 1: 10, 2: 22, 3: 154, 4: 158, 5: 158}
    default = view_of(resnet50_log)
    assert (default.depth, default.auto_depth, default.deepest) == (2, True, 4)
    folded = {n.key[1]: n.folded for n in default.nodes()}
    assert folded["layer3.0"] == 12 and folded["layer3.1"] == 9 and folded["fc"] == 0
    assert [c.key[1] for c in default.inside((0, ""))
            if type(c).__name__ == "Cluster"] == ["layer1", "layer2", "layer3", "layer4"]


@pytest.mark.slow
def test_resnet50_default_picture_renders(resnet50_log: Path, tmp_path: Path) -> None:
    written = write_picture(resnet50_log, tmp_path / "r50.svg")
    assert written.picture.nodes == 22
    texts = svg_texts(written.path)
    assert "layer3" in texts and "layer3.5" in texts


# -- bad input: one line on stderr, exit 2, nothing overwritten --------------------------------


def bad_inputs(tmp: Path, log: Path) -> dict[str, tuple[list[str], str]]:
    (tmp / "empty.jsonl").write_bytes(b"")
    (tmp / "text.jsonl").write_text("hello\n")
    (tmp / "dir.jsonl").mkdir()
    write_log(tmp / "no_events.jsonl", [])
    return {
        "missing": (["render", str(tmp / "nope.jsonl")], "no such log"),
        "directory": (["render", str(tmp / "dir.jsonl")], "is a directory, not a log"),
        "empty": (["render", str(tmp / "empty.jsonl")], "is empty, not a hooktrace log"),
        "not jsonl": (["render", str(tmp / "text.jsonl")], "is not a hooktrace log"),
        "no events": (["render", str(tmp / "no_events.jsonl")], "has no events"),
        "step": (["render", str(log), "--step", "7"], "no step 7 in"),
        "model": (["render", str(log), "--model", "nope"], "its models: 'net'"),
        "format": (["render", str(log), "--format", "jpg"],
                   "unknown format 'jpg'; choose one of dot, svg, png, pdf"),
        "extension": (["render", str(log), "-o", str(tmp / "x.jpg")], "unknown format 'jpg'"),
        "output is the log": (["render", str(log), "-o", str(log)],
                              "refusing to write the picture over the log"),
        "show step": (["show", str(log), "--step", "7"], "its steps: 0-1"),
    }


@pytest.mark.parametrize("case", [
    "missing", "directory", "empty", "not jsonl", "no events", "step", "model", "format",
    "extension", "output is the log", "show step"])
def test_bad_input(case: str, tmp_path: Path) -> None:
    log = write_log(tmp_path / "good.jsonl", [*chain_step(0, 1), *chain_step(1, 10)])
    before = log.read_bytes()
    args, message = bad_inputs(tmp_path, log)[case]
    out = tmp_path / "picture.svg"
    out.write_text("keep me")
    if case not in ("output is the log", "extension", "show step"):
        args += ["-o", str(out)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert result.stderr.startswith("hooktrace: error: ") and result.stderr.count("\n") == 1
    assert message in result.stderr
    assert out.read_text() == "keep me" and log.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix in (".svg", ".dot")) == [
        "picture.svg"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_unreadable_log(tmp_path: Path) -> None:
    log = write_log(tmp_path / "secret.jsonl", chain_step(0, 1))
    log.chmod(0)
    result = CliRunner().invoke(cli, ["render", str(log)])
    assert result.exit_code == 2
    assert result.stderr == f"hooktrace: error: cannot read {log}: permission denied\n"


def test_log_without_end_record_renders_with_a_warning(tmp_path: Path) -> None:
    log = write_log(tmp_path / "crashed.jsonl", chain_step(0, 1), end=False)
    result = CliRunner().invoke(cli, ["render", str(log), "--format", "dot"])
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines() == [
        f"hooktrace: warning: {log} has no end record: the run did not finish",
        f"hooktrace: wrote {log.with_suffix('.dot')}: step 0, depth 1 (auto): 2 modules, "
        "2 edges (1 forward, 1 backward)"]
    with pytest.warns(UserWarning, match="no end record"):
        render(log)


def test_without_dot_writes_the_dot_file_and_exits_2(branchy_log: Path, tmp_path: Path) -> None:
    out = tmp_path / "b.svg"
    out.write_text("keep me")
    done = hooktrace_cmd("render", branchy_log, "-o", out,
                         env={**os.environ, "PATH": str(tmp_path)})  # no dot on this PATH
    assert done.returncode == 2
    assert done.stderr == (
        f"hooktrace: error: wrote {tmp_path / 'b.dot'} only: the Graphviz program dot, "
        "needed for svg, is not installed: apt install graphviz, dnf install graphviz, brew "
        "install graphviz or conda install -c conda-forge graphviz\n")
    assert (tmp_path / "b.dot").read_text(encoding="utf-8") == picture(branchy_log).source
    assert out.read_text() == "keep me"


def test_render_and_show_do_not_import_torch(branchy_log: Path, tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from hooktrace.cli import cli\n"
        f"cli.main(['render', {str(branchy_log)!r}, '-o', {str(tmp_path / 'x.svg')!r}],"
        " standalone_mode=False)\n"
        f"cli.main(['show', {str(branchy_log)!r}], standalone_mode=False)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy')))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[]"


def test_gan_generator_backward_in_the_next_step(tmp_path: Path) -> None:
    """The generator runs forward in the discriminator's step and gets its backward in the
    next one: step 0 draws it as 'backward in step 1', not as a module without gradient."""
    log = tmp_path / "gan.jsonl"
    run_sample(log, "gan.py", "--iterations", "1")
    step0 = build(steplog.load_step(log, 0))
    generator = [n for n in step0.nodes() if n.key[0] == 0]
    assert len(generator) == 4
    assert {(node_state(n, step0.checked), n.later) for n in generator} == {
        ("backward later", 1)}
    assert "backward in step 1" in picture(log, step=0).source
    step1 = steplog.load_step(log, 1)
    assert any("backward of calls made in an earlier step (model generator)" in w
               for w in step1.warnings)
    only_backward = picture(log, step=1, model="generator")  # its forward ran in step 0
    assert only_backward.nodes == 0 and "<svg" in only_backward.svg()


def test_nodes_coloured_by_gradient_health(tmp_path: Path) -> None:
    """nan_layer's compress makes NaN at step 3: it and what follows have NaN outputs; the
    layers before it only see NaN gradients; at step 2 everything is healthy."""
    log = tmp_path / "nan.jsonl"
    run_sample(log, "nan_layer.py")
    states = {n.key[1]: node_state(n, True) for n in build(steplog.load_step(log, 3)).nodes()}
    assert states == {"fc1": "nan/inf gradient", "act": "nan/inf gradient",
                      "compress": "nan/inf output", "fc2": "nan/inf output"}
    assert {node_state(n, True) for n in build(steplog.load_step(log, 2)).nodes()} == {"ok"}
    source = picture(log, step=3).source
    assert "an output held NaN/Inf" in source and "nan/inf output" in source
    assert '"1 · |g| NaN"' in source and "backward starts · |g| NaN" in source


def test_exploding_gradients_coloured(tmp_path: Path) -> None:
    log = tmp_path / "exploding.jsonl"
    run_sample(log, "exploding.py")
    states = [node_state(n, True) for n in build(steplog.load_step(log, 0), depth=2).nodes()]
    assert states.count("exploding") >= 10 and "vanishing" not in states


def test_transformer_encoder_default_picture(tmp_path: Path) -> None:
    """A transformers-style encoder: the default depth keeps it readable (at most 40 nodes, down
    to the layers' Linear/LayerNorm calls), and the real dot lays it out."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, batch_first=True)
    encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
    log = tmp_path / "encoder.jsonl"
    with hooktrace.trace(log, model=encoder):
        encoder(torch.randn(2, 8, 32)).sum().backward()
    view = build(steplog.load_step(log))
    names = {n.key[1] for n in view.nodes()}
    assert view.graph.number_of_nodes() <= 40
    assert {"layers.0.linear1", "layers.0.norm2", "layers.1.self_attn"} <= names
    written = write_picture(log, tmp_path / "encoder.svg")
    texts = svg_texts(written.path)
    assert "layers.1.linear2" in texts


def test_render_skims_the_steps_it_does_not_draw(tmp_path: Path) -> None:
    """Events of other steps are read for their step, seq, module and fwd only: a damaged
    statistic in step 2 leaves the picture of step 0 as it was, while drawing step 2, or
    checking the log, names the line."""
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    log = tmp_path / "three.jsonl"
    with hooktrace.trace(log, model=model):
        for _ in range(3):
            model(torch.randn(3, 4)).sum().backward()
    lines = log.read_bytes().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines)
              if b'"type":"backward"' in line and b'"step":2' in line and b'"out_stats"' in line)
    damaged = tmp_path / "damaged.jsonl"
    bad = lines[at].replace(b'"out_stats":[[', b'"out_stats":[["x",')
    damaged.write_bytes(b"".join([*lines[:at], bad, *lines[at + 1:]]))
    assert damaged.read_bytes() != log.read_bytes()
    for path in (log, damaged):
        result = hooktrace_cmd("render", path, "--format", "dot",
                               "-o", tmp_path / f"{path.stem}.dot")
        assert result.returncode == 0, result.stderr
    assert (tmp_path / "damaged.dot").read_bytes() == (tmp_path / "three.dot").read_bytes()
    for args in (("render", damaged, "--step", "2", "--format", "dot", "-o", tmp_path / "2.dot"),
                 ("check", damaged)):
        result = hooktrace_cmd(*args)
        assert result.returncode == 2, result.stderr
        assert f"line {at + 1}" in result.stderr and "Traceback" not in result.stderr


# -- the gradient's size on backward edges ------------------------------------------------------


@pytest.mark.parametrize(("norm", "text"), [(0.0321, "3.2e-2"), (1.0, "1.0e0"), (2.24e8, "2.2e8"),
                                            (0.0, "0"), (float("nan"), "NaN"),
                                            (float("inf"), "Inf")])
def test_norm_text_is_compact(norm: float, text: str) -> None:
    assert norm_text(norm) == text


def test_backward_edges_show_the_norm_of_the_gradient_reaching_the_call(mnist_log: Path) -> None:
    """Each backward edge enters a call: its label is that call's grad_output norm, from the
    log; "gi 1 go 1" is gone (all are 1 / 1 here)."""
    view = view_of(mnist_log)
    backward = {e.fqn: e for e in steplog.load_step(mnist_log).events
                if isinstance(e, schema.BackwardEvent)}
    source = picture(mnist_log).source
    for edge in view.edges():
        if edge.phase == "backward":
            stats = backward[edge.dst[1]].grad_output_stats
            assert stats is not None and stats[0] is not None
            assert edge.grad_norm == pytest.approx(stats[0][0])
            assert f'label="{edge.order} · |g| {norm_text(stats[0][0])}"' in source
    assert "gi 1 go 1" not in source and "gi 2 go 1" not in source


def test_counts_kept_where_not_one_to_one_and_no_norm_without_statistics(tmp_path: Path) -> None:
    """A module with two inputs keeps "gi 2 go 1"; a log without statistics has no norms."""

    class Pair(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.mix = Mix()
            self.head = nn.Linear(3, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.mix(x, x * 2))

    class Mix(nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return a + b

    model = Pair()
    x = torch.randn(2, 3, requires_grad=True)
    for stats in (True, False):
        log = tmp_path / f"pair{stats}.jsonl"
        with hooktrace.trace(log, model=model, stats=stats):
            model(x).sum().backward()
        source = picture(log).source
        assert ("|g| " in source) is stats
        counted = [line for line in source.splitlines() if "gi 2 go 1" in line and "->" in line]
        assert len(counted) == 1 and '"m0/mix#0" -> "m0/head#0"' in counted[0], counted
        assert "gi 1 go 1" not in source


# -- an unrolled loop: a module's many calls, one node ------------------------------------------


class Unrolled(nn.Module):
    """One LSTMCell and a Linear called once per time step, as an RNN loop unrolled by hand."""

    def __init__(self) -> None:
        super().__init__()
        self.cell = nn.LSTMCell(2, 4)
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = c = torch.zeros(x.size(0), 4)
        outputs = []
        for t in range(x.size(1)):
            h, c = self.cell(x[:, t], (h, c))
            outputs.append(self.head(h))
        return torch.stack(outputs, 1)


@pytest.fixture(scope="module")
def unrolled_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    log = tmp_path_factory.mktemp("unrolled") / "unrolled.jsonl"
    model = Unrolled()
    with hooktrace.trace(log, model=model):
        model(torch.randn(3, 20, 2)).sum().backward()
    return log


def test_an_unrolled_loop_is_one_node_per_module(unrolled_log: Path, tmp_path: Path) -> None:
    """20 calls of each module (more than FOLD_CALLS): a node each, ``LSTMCell x20``, and the
    edges their calls repeat are one edge each with their first and last number and count:
    each cell's h feeds the head and the next cell (a loop on the cell's node). Without data
    flow, as then, the calls in call order: cell, head, cell, ..."""
    view = view_of(unrolled_log)
    assert sorted(view.node_map) == [(0, "cell", -1), (0, "head", -1)]
    cell = view.node_map[(0, "cell", -1)]
    assert (cell.module_calls, cell.folded, cell.grad_calls, cell.missing) == (20, 0, 20, 0)
    assert cell.output_shapes == [[3, 4], [3, 4]]  # the same in every call
    assert [(e.phase, e.src[1], e.dst[1], e.order, e.last, e.runs) for e in view.edges()] == [
        ("forward", "cell", "head", 1, 39, 20), ("forward", "cell", "cell", 2, 38, 19),
        ("backward", "head", "cell", 1, 39, 20), ("backward", "cell", "cell", 2, 38, 19)]
    old = view_of(without_dataflow(unrolled_log, tmp_path / "old.jsonl"))
    assert [(e.phase, e.src[1], e.dst[1], e.order, e.last, e.runs) for e in old.edges()] == [
        ("forward", "cell", "head", 1, 39, 20), ("forward", "head", "cell", 2, 38, 19),
        ("backward", "head", "cell", 1, 39, 20), ("backward", "cell", "head", 2, 38, 19)]
    source = picture(unrolled_log, findings=False).source
    assert f"LSTMCell {TIMES}20" in source and f"Linear {TIMES}20" in source
    assert f"1\N{HORIZONTAL ELLIPSIS}39 {TIMES}20" in source
    assert "(--every-call: each)" in source  # and the legend says what it means
    every = build(steplog.load_step(unrolled_log), every_call=True)
    assert len(every.node_map) == 40
    assert {e.runs for e in every.edges()} == {1}
    each = picture(unrolled_log, findings=False, every_call=True).source
    assert f"LSTMCell {TIMES}20" not in each and "LSTMCell · call 20/20" in each


def test_every_call_on_the_command_line(unrolled_log: Path, tmp_path: Path) -> None:
    for flags, nodes in (((), 2), (("--every-call",), 40)):
        out = tmp_path / f"u{len(flags)}.dot"
        result = hooktrace_cmd("render", unrolled_log, "-o", out, *flags)
        assert result.returncode == 0, result.stderr
        assert f"{nodes} modules" in result.stderr


