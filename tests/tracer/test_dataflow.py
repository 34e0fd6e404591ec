"""Pictures that follow the data: each forward event names the calls that made its inputs, and
``render``, ``view`` and ``show --edges`` draw producer -> consumer edges forward, and the same
edges reversed where the gradient went back along them.

Real models: the pytorch/examples VAE (two heads), torchvision resnet18's BasicBlocks
(residuals, a downsample), a two-tower model, the GAN sample (a detached input); exact
producer -> consumer pairs, forward in execution order and backward in the order autograd ran.
"""

from __future__ import annotations

import itertools
import json
import runpy
import warnings
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from helpers import (
    SAMPLES,
    run_sample,  # traces a sample in this process, as `run` does
)
from torch import nn

import hooktrace
from hooktrace.cli import cli
from hooktrace.hooks import dataflow
from hooktrace.log import schema
from hooktrace.log.reader import LogReader
from hooktrace.show import steplog
from hooktrace.show.graph import build
from hooktrace.show.picture import View

Pair = tuple[str, str]


def view_of(log: Path, depth: int | None = None, step: int | None = None) -> View:
    return build(steplog.load_step(log, step), depth)


def name(key: tuple[int, str, int], view: View) -> str:
    """``fqn`` of a node, ``fqn#2`` for the second call of a module called several times."""
    calls, fqn = view.node_map[key].module_calls, key[1] or "(root)"
    return fqn if calls == 1 or key[2] < 0 else f"{fqn}#{key[2] + 1}"


def pairs(view: View, phase: str) -> list[Pair]:
    """The edges of a phase as (src, dst) names, in their order."""
    return [(name(e.src, view), name(e.dst, view)) for e in view.edges() if e.phase == phase]


def events(log: Path, phase: str, step: int | None = None
           ) -> list[schema.ForwardEvent | schema.BackwardEvent]:
    """The log's events of a phase (and step), forward ones with their data flow."""
    return [e for e in LogReader(log, flow=True)
            if isinstance(e, (schema.ForwardEvent, schema.BackwardEvent))
            and e.phase == phase and step in (None, e.step)]


# -- the VAE: fc1 -> (fc21, fc22) -> reparameterize -> fc3 -> fc4 ------------------------------


@pytest.fixture(scope="module")
def vae_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    log = tmp_path_factory.mktemp("vae") / "vae.jsonl"
    run_sample(log, "vae.py")
    return log


def test_vae_two_heads(vae_log: Path) -> None:
    """fc1 feeds both heads; the reparameterisation (functional) joins them into fc3. Backward
    runs fc3 -> fc22 before fc3 -> fc21 (autograd's order: fc22's node was made later), then
    both heads into fc1; no edge between the heads either way."""
    view = view_of(vae_log)
    assert view.dataflow and view.depth == 1
    assert pairs(view, "forward") == [
        ("fc1", "fc21"), ("fc1", "fc22"), ("fc21", "fc3"), ("fc22", "fc3"), ("fc3", "fc4")]
    assert pairs(view, "backward") == [
        ("fc4", "fc3"), ("fc3", "fc22"), ("fc3", "fc21"), ("fc22", "fc1"), ("fc21", "fc1")]
    assert [e.order for e in view.edges()] == [1, 2, 3, 4, 5, 1, 2, 3, 4, 5]
    backward = {e.fqn: e for e in events(vae_log, "backward", 0)}
    for edge in view.edges():  # the norm of the gradient reaching the producer, as before
        if edge.phase == "backward":
            stats = backward[edge.dst[1]].grad_output_stats
            assert stats is not None and stats[0] is not None
            assert edge.grad_norm == pytest.approx(stats[0][0])


def test_vae_log_names_the_producers(vae_log: Path) -> None:
    """What the forward events hold: the producing calls' seqs per input; the root's made;
    on the wire, offsets, and no "from" where the input came from the call just before."""
    forward = {e.fqn: e for e in events(vae_log, "forward", 0)}
    seq = {fqn: e.seq for fqn, e in forward.items()}
    assert {fqn: e.inputs_from for fqn, e in forward.items()} == {
        "fc1": [[]], "fc21": [[seq["fc1"]]], "fc22": [[seq["fc1"]]],
        "fc3": [[seq["fc21"], seq["fc22"]]], "fc4": [[seq["fc3"]]], "": [[]]}
    assert forward[""].made == [seq["fc21"], seq["fc22"], seq["fc4"]]
    assert all(e.made is None for fqn, e in forward.items() if fqn)
    lines = [json.loads(line) for line in vae_log.read_text().splitlines()]
    assert lines[0]["dataflow"] is True
    wire = [d for d in lines if d["type"] == "forward" and d["step"] == 0]
    assert [d.get("from") for d in wire] == [[None], None, [2], [[2, 1]], None, [None]]
    assert wire[-1]["made"] == [4, 3, 1]


def test_show_edges_prints_what_render_draws(vae_log: Path) -> None:
    result = CliRunner().invoke(cli, ["show", str(vae_log), "--edges"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == ("step 0 (steps in the log: 0-1): model (VAE): depth 1 of 1 (auto): "
                        "5 forward edges, 5 backward edges")
    forward = lines[lines.index("forward: from the call that made a tensor to each call that "
                                "used it, in execution order") + 1:][:5]
    assert [line.split() for line in forward] == [
        ["1", "fc1", "->", "fc21"], ["2", "fc1", "->", "fc22"], ["3", "fc21", "->", "fc3"],
        ["4", "fc22", "->", "fc3"], ["5", "fc3", "->", "fc4"]]
    backward = [line.split()[:4] for line in lines if "|g|" in line and "->" in line]
    assert backward == [["1", "fc4", "->", "fc3"], ["2", "fc3", "->", "fc22"],
                        ["3", "fc3", "->", "fc21"], ["4", "fc22", "->", "fc1"],
                        ["5", "fc21", "->", "fc1"]]
    only = CliRunner().invoke(cli, ["show", str(vae_log), "--edges", "--phase", "forward"])
    assert "backward" not in only.stdout.split("\n", 1)[1] and "fc3 -> fc4" in only.stdout
    alone = CliRunner().invoke(cli, ["show", str(vae_log), "--depth", "1"])
    assert alone.exit_code == 2 and "--depth folds the edges of --edges" in alone.stderr


# -- resnet18: BasicBlocks, their residual adds, a downsample ----------------------------------


@pytest.fixture(scope="module")
def resnet18_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torchvision = pytest.importorskip("torchvision")
    log = tmp_path_factory.mktemp("resnet18") / "resnet18.jsonl"
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None)
    with hooktrace.trace(log, model=model):
        model(torch.randn(2, 3, 32, 32)).sum().backward()
    return log


def block(view: View, phase: str, *blocks: str) -> list[Pair]:
    """The pairs of a phase with an end inside one of ``blocks``."""
    return [(a, b) for a, b in pairs(view, phase)
            if any(x.startswith(f"{k}.") for x in (a, b) for k in blocks)]


@pytest.mark.slow
def test_resnet18_basic_blocks(resnet18_log: Path) -> None:
    """At depth 3 each block is a box of its calls: the residual add (out += identity) is two
    edges into the block's second relu, from bn2 and from the block's input (the previous
    block's relu, or downsample); backward goes back along each, in autograd's order."""
    view = view_of(resnet18_log, depth=3)
    assert block(view, "forward", "layer1.0") == [
        ("maxpool", "layer1.0.conv1"), ("layer1.0.conv1", "layer1.0.bn1"),
        ("layer1.0.bn1", "layer1.0.relu#1"), ("layer1.0.relu#1", "layer1.0.conv2"),
        ("layer1.0.conv2", "layer1.0.bn2"), ("maxpool", "layer1.0.relu#2"),
        ("layer1.0.bn2", "layer1.0.relu#2"), ("layer1.0.relu#2", "layer1.1.conv1"),
        ("layer1.0.relu#2", "layer1.1.relu#2")]
    assert block(view, "forward", "layer2.0") == [
        ("layer1.1.relu#2", "layer2.0.conv1"), ("layer2.0.conv1", "layer2.0.bn1"),
        ("layer2.0.bn1", "layer2.0.relu#1"), ("layer2.0.relu#1", "layer2.0.conv2"),
        ("layer2.0.conv2", "layer2.0.bn2"), ("layer1.1.relu#2", "layer2.0.downsample"),
        ("layer2.0.bn2", "layer2.0.relu#2"), ("layer2.0.downsample", "layer2.0.relu#2"),
        ("layer2.0.relu#2", "layer2.1.conv1"), ("layer2.0.relu#2", "layer2.1.relu#2")]
    assert block(view, "backward", "layer2.0") == [
        ("layer2.1.relu#2", "layer2.0.relu#2"), ("layer2.1.conv1", "layer2.0.relu#2"),
        ("layer2.0.relu#2", "layer2.0.downsample"), ("layer2.0.relu#2", "layer2.0.bn2"),
        ("layer2.0.bn2", "layer2.0.conv2"), ("layer2.0.conv2", "layer2.0.relu#1"),
        ("layer2.0.relu#1", "layer2.0.bn1"), ("layer2.0.bn1", "layer2.0.conv1"),
        ("layer2.0.downsample", "layer1.1.relu#2"), ("layer2.0.conv1", "layer1.1.relu#2")]
    assert block(view, "backward", "layer1.0") == [
        ("layer1.1.relu#2", "layer1.0.relu#2"), ("layer1.1.conv1", "layer1.0.relu#2"),
        ("layer1.0.relu#2", "layer1.0.bn2"), ("layer1.0.bn2", "layer1.0.conv2"),
        ("layer1.0.conv2", "layer1.0.relu#1"), ("layer1.0.relu#1", "layer1.0.bn1"),
        ("layer1.0.bn1", "layer1.0.conv1"), ("layer1.0.relu#2", "maxpool"),
        ("layer1.0.conv1", "maxpool")]
    assert all(e.mirrored for e in view.edges())
    forward = {(e.src, e.dst) for e in view.edges() if e.phase == "forward"}
    assert {(e.dst, e.src) for e in view.edges() if e.phase == "backward"} == forward


@pytest.mark.slow
def test_resnet18_folded_blocks_are_a_chain(resnet18_log: Path) -> None:
    """At the default depth (2) the blocks are nodes: their residuals are inside them."""
    view = view_of(resnet18_log)
    chain = ["conv1", "bn1", "relu", "maxpool", "layer1.0", "layer1.1", "layer2.0", "layer2.1",
             "layer3.0", "layer3.1", "layer4.0", "layer4.1", "avgpool", "fc"]
    assert view.depth == 2
    links = list(itertools.pairwise(chain))
    assert pairs(view, "forward") == links
    assert pairs(view, "backward") == [(b, a) for a, b in reversed(links)]


# -- two towers: two inputs, one head -----------------------------------------------------------


class TwoTower(nn.Module):
    """A user tower and an item tower on their own inputs; the head reads both, concatenated."""

    def __init__(self) -> None:
        super().__init__()
        self.user = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 4))
        self.item = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 4))
        self.head = nn.Linear(8, 1)

    def forward(self, user: torch.Tensor, item: torch.Tensor) -> torch.Tensor:
        return self.head(torch.cat([self.user(user), self.item(item)], 1))


def test_two_towers(tmp_path: Path) -> None:
    """Each tower a chain from its own input; both into the head (torch.cat is no call).
    Drawn with the towers folded (depth 1) or open (depth 2); backward along both, in the
    order of the backward events."""
    torch.manual_seed(0)
    model = TwoTower()
    log = tmp_path / "towers.jsonl"
    with hooktrace.trace(log, model=model):
        model(torch.randn(3, 6), torch.randn(3, 5)).sum().backward()
    folded = view_of(log, depth=1)
    assert pairs(folded, "forward") == [("user", "head"), ("item", "head")]
    assert pairs(folded, "backward") == [("head", "item"), ("head", "user")]
    view = view_of(log, depth=2)
    assert pairs(view, "forward") == [
        ("user.0", "user.1"), ("user.1", "user.2"), ("item.0", "item.1"), ("item.1", "item.2"),
        ("user.2", "head"), ("item.2", "head")]
    assert pairs(view, "backward") == [  # autograd runs the item tower first, all of it
        ("head", "item.2"), ("item.2", "item.1"), ("item.1", "item.0"), ("head", "user.2"),
        ("user.2", "user.1"), ("user.1", "user.0")]


# -- a detached input, a box whose own forward adds, no autograd at all -------------------------


def test_gan_detached_fake_is_data_without_gradient(tmp_path: Path) -> None:
    """The discriminator's step: the generator's output reaches the discriminator's second call
    through ``.detach()`` (found by its storage): a forward edge, and no backward along it."""
    log = tmp_path / "gan.jsonl"
    run_sample(log, "gan.py", "--iterations", "1")
    view = view_of(log, step=0)
    generator = [("0", "1"), ("1", "2"), ("2", "3")]
    real = [("0#1", "1#1"), ("1#1", "2#1"), ("2#1", "(root)#1")]
    fake = [("3", "0#2"), ("0#2", "1#2"), ("1#2", "2#2"), ("2#2", "(root)#2")]
    assert pairs(view, "forward") == [*generator, *real, *fake]
    assert pairs(view, "backward") == [(b, a) for a, b in [*fake[:0:-1], *real[::-1]]]
    models = {e.dst[0] for e in view.edges() if e.src[1] == "3"}
    assert models == {1}  # generator.3 -> discriminator.0


class Residual(nn.Module):
    """A block whose own forward adds its input to its branch's output."""

    def __init__(self) -> None:
        super().__init__()
        self.f = nn.Sequential(nn.Linear(8, 8), nn.Tanh())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.f(x)


def test_a_box_stands_for_the_calls_that_made_its_output(tmp_path: Path) -> None:
    """Drawn as boxes (depth 3), blocks that add their input to their branch: the call after
    a block gets an edge from the branch and one from the block's input (the skip), followed
    one box back; drawn as nodes (depth 2), a chain of blocks."""
    torch.manual_seed(0)
    model = nn.Sequential()
    model.add_module("stem", nn.Linear(4, 8))
    model.add_module("blocks", nn.Sequential(Residual(), Residual(), Residual()))
    model.add_module("head", nn.Linear(8, 2))
    log = tmp_path / "residual.jsonl"
    with hooktrace.trace(log, model=model):
        model(torch.randn(2, 4)).sum().backward()
    assert pairs(view_of(log, depth=2), "forward") == [
        ("stem", "blocks.0"), ("blocks.0", "blocks.1"), ("blocks.1", "blocks.2"),
        ("blocks.2", "head")]
    view = view_of(log, depth=3)
    assert pairs(view, "forward") == [
        ("stem", "blocks.0.f"), ("stem", "blocks.1.f"), ("blocks.0.f", "blocks.1.f"),
        ("blocks.0.f", "blocks.2.f"), ("blocks.1.f", "blocks.2.f"), ("blocks.1.f", "head"),
        ("blocks.2.f", "head")]
    assert sorted(pairs(view, "backward")) == sorted((b, a) for a, b in pairs(view, "forward"))


def test_without_autograd_the_storage_says(tmp_path: Path) -> None:
    """Under no_grad (an eval step) a call's output reaching the next call unchanged, as a view
    (flatten) or changed in place (ReLU(inplace=True)) is found by its storage; a functional op
    that makes a new tensor between two calls (F.relu) is followed (before: it hid the link)."""

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(1, 2, 3)
            self.act = nn.ReLU(inplace=True)
            self.fc = nn.Linear(8, 4)
            self.out = nn.Linear(4, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.fc(torch.flatten(self.act(self.conv(x)), 1))
            return self.out(torch.relu(h))

    model = Net().eval()
    log = tmp_path / "eval.jsonl"
    with hooktrace.trace(log, model=model), torch.no_grad():
        model(torch.randn(3, 1, 4, 4))
    view = view_of(log)
    assert pairs(view, "forward") == [("conv", "act"), ("act", "fc"), ("fc", "out")]
    assert not view.checked and pairs(view, "backward") == []


def test_fake_tensors_are_not_looked_up_by_storage(tmp_path: Path) -> None:
    """A forward on fake tensors (torch.export, FLOP counters) has no storage to look at: no
    warning about a fake tensor's data pointer reaches the program, and the calls are linked
    by their autograd nodes as on real tensors."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    log = tmp_path / "fake.jsonl"
    with hooktrace.trace(log, model=model), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with FakeTensorMode(allow_non_fake_inputs=True) as mode:
            model(mode.from_tensor(torch.randn(2, 4)))
        with torch.no_grad(), FakeTensorMode(allow_non_fake_inputs=True) as mode:
            model(mode.from_tensor(torch.randn(2, 4)))
    assert [str(w.message) for w in caught if "data pointer" in str(w.message)] == []
    forward = [e for e in events(log, "forward") if e.fqn]
    assert [e.inputs_from for e in forward[:3]] == [[[]], [[forward[0].seq]],
                                                    [[forward[1].seq]]]
    assert [e.inputs_from for e in forward[3:]] == [[[]]] * 3  # no autograd, no storage


# -- the walk is bounded; watched steps pay nothing; the program is unchanged -------------------


class Chain(nn.Module):
    """Two calls with ``ops`` functional ops between them."""

    def __init__(self, ops: int) -> None:
        super().__init__()
        self.a, self.b, self.ops = nn.Linear(3, 3), nn.Linear(3, 3), ops

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        for _ in range(self.ops):
            h = h * 1.0001
        return self.b(h)


@pytest.mark.parametrize(("ops", "found"), [(dataflow.MAX_NODES - 2, True),
                                            (dataflow.MAX_NODES + 1, False)])
def test_the_walk_back_is_bounded(tmp_path: Path, ops: int, found: bool) -> None:
    """Within MAX_NODES autograd nodes the producer is found; past them, none is named."""
    log = tmp_path / "chain.jsonl"
    with hooktrace.trace(log, model=(model := Chain(ops))):
        model(torch.randn(2, 3, requires_grad=True)).sum().backward()
    forward = {e.fqn: e for e in events(log, "forward")}
    assert forward["b"].inputs_from == ([[forward["a"].seq]] if found else [[]])


def test_watched_steps_pay_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the recorded step's calls ask for their producers; the watched steps after it
    never do (counted on hooktrace's own class, not on torch)."""
    asked: list[str] = []
    start, end = dataflow.DataFlow.start, dataflow.DataFlow.end
    monkeypatch.setattr(dataflow.DataFlow, "start",
                        lambda self, *a: asked.append("start") or start(self, *a))
    monkeypatch.setattr(dataflow.DataFlow, "end",
                        lambda self, *a: asked.append("end") or end(self, *a))
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 1))
    with hooktrace.trace(tmp_path / "w.jsonl", model=model, steps="0"):
        for _ in range(3):
            model(torch.randn(2, 3)).sum().backward()
    assert sorted(asked) == ["end"] * 4 + ["start"] * 4  # the 4 calls of step 0


def test_tracing_leaves_outputs_and_gradients_alone(tmp_path: Path) -> None:
    """Walking the autograd graph (and its nodes' metadata) changes nothing: the VAE's outputs
    and every parameter's gradient are bit-identical traced and not."""
    vae = runpy.run_path(str(SAMPLES / "vae.py"))

    def step(traced: bool) -> list[torch.Tensor]:
        torch.manual_seed(0)
        model = vae["VAE"]()
        data = torch.rand(4, 1, 28, 28)
        if traced:
            with hooktrace.trace(tmp_path / "t.jsonl", model=model):
                recon, mu, logvar = model(data)
                vae["loss_function"](recon, data, mu, logvar).backward()
        else:
            recon, mu, logvar = model(data)
            vae["loss_function"](recon, data, mu, logvar).backward()
        return [recon, mu, logvar, *(p.grad for p in model.parameters() if p.grad is not None)]

    plain, traced = step(False), step(True)
    assert len(plain) == 13 and all(torch.equal(a, b) for a, b in zip(plain, traced, strict=True))


def following() -> bool:
    """Whether data flow's follower of operations is on this thread's dispatch stack."""
    return any(isinstance(torch._C._get_dispatch_stack_at(i), dataflow._Operations)
               for i in range(torch._C._len_torch_dispatch_stack()))


def test_operations_are_followed_only_inside_recorded_calls_under_no_grad(
        tmp_path: Path) -> None:
    """The follower of operations is on torch's stack while a recorded call that began under
    ``no_grad`` runs, never in a training call, between calls, in watched steps or after
    tracing; a call that raised leaves it at the next model call's end."""

    class Probe(nn.Module):
        def __init__(self, fail: bool = False) -> None:
            super().__init__()
            self.fc, self.fail = nn.Linear(3, 3), fail
            self.seen: list[bool] = []

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.seen.append(following())
            if self.fail:
                raise ValueError("a batch skipped")
            return self.fc(x)

    model, broken = Probe(), Probe(fail=True)
    between = []
    with hooktrace.trace(tmp_path / "f.jsonl", steps="0"):
        for _ in range(3):
            with torch.no_grad():  # a validation
                with pytest.raises(ValueError):
                    broken(torch.randn(2, 3))
                model(torch.randn(2, 3))
            between.append(following())
            model(torch.randn(2, 3)).sum().backward()
            between.append(following())
    assert broken.seen == [True, False, False]
    assert model.seen == [True, False] + [False, False] * 2
    assert between == [False] * 6 and not following()


def test_the_fast_path_of_attention_is_unchanged(tmp_path: Path) -> None:
    """Under no_grad an eval ``TransformerEncoder`` with a padding mask takes its fast path
    (nested tensors: zeros at padded positions), traced as not: the follower of operations
    runs below autograd, where no ``has_torch_function`` check sees it. Tracing stops inside it
    (the statistics cannot sum a nested tensor): the follower goes with it."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)
    model = nn.TransformerEncoder(layer, 2, enable_nested_tensor=True).eval()
    src, mask = torch.randn(2, 5, 8), torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nested tensors are a prototype
        plain = model(src, src_key_padding_mask=mask)
        with hooktrace.trace(tmp_path / "t.jsonl", model=model):
            traced = model(src, src_key_padding_mask=mask)
    assert torch.equal(plain, traced) and bool((traced[1, 3:] == 0).all())
    assert not following()  # also where tracing stopped inside the call (a nested output)


# -- the log: old logs, damaged keys, readers that do not ask for it ----------------------------


def test_readers_that_do_not_draw_skip_the_data_flow(vae_log: Path) -> None:
    """check's and diff's rows carry no data flow (their quick path stays quick); a damaged
    "from" fails the picture of its step with the line's number, not check."""
    from hooktrace.log.decoder import ForwardRows

    rows = [row for item in LogReader(vae_log).scan() if isinstance(item, ForwardRows)
            for row in item]
    assert len(rows) == 12 and all(row[-1] is None for row in rows)
    assert all(e.inputs_from is None and e.made is None for e in LogReader(vae_log)
               if isinstance(e, schema.ForwardEvent))  # unless asked for: LogReader(flow=True)
    flowing = [row for item in LogReader(vae_log).scan(flow=True)
               if isinstance(item, ForwardRows) for row in item]
    assert [row[-1].inputs_from for row in flowing][:3] == [[[]], [[1]], [[1]]]
    lines = vae_log.read_text().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if '"from":[[2,1]]' in line)
    damaged = vae_log.with_name("damaged.jsonl")
    damaged.write_text("".join([*lines[:at], lines[at].replace("[[2,1]]", '["x"]'),
                                *lines[at + 1:]]))
    result = CliRunner().invoke(cli, ["render", str(damaged), "--format", "dot",
                                      "-o", str(vae_log.with_name("d.dot"))])
    assert result.exit_code == 2
    assert f"line {at + 1}: key 'from' holds something" in result.stderr
    assert CliRunner().invoke(cli, ["check", str(damaged)]).exit_code == 0


def test_data_flow_round_trip(tmp_path: Path) -> None:
    """Written as offsets (none where the call just before made every input), read back as the
    seqs written; a log whose header lacks ``dataflow`` has none, whatever its lines hold."""
    from hooktrace.log.writer import LogWriter

    flows = [((), None), (((),), None), (((4,),), None), (((4,), (4,)), None),
             (((1, 3), (), (2,)), (2, 4))]
    for dataflow_on in (True, False):
        path = tmp_path / f"flow{dataflow_on}.jsonl"
        writer = LogWriter(path)
        writer.write(schema.Header(schema=schema.SCHEMA_VERSION, hooktrace="0",
                                   dataflow=dataflow_on))
        writer.write(schema.Module(model=0, fqn="m", cls="Linear"))
        for i, (inputs, made) in enumerate(flows):
            writer.write(schema.ForwardEvent(5, i, 0, "m", 0, [[1]] * len(inputs),
                                             ["float32"] * len(inputs), inputs_from=inputs,
                                             made=made))
        writer.write(schema.End(status="ok"))
        writer.close()
        read = [(e.inputs_from, e.made) for e in LogReader(path, flow=True)
                if isinstance(e, schema.ForwardEvent)]
        expected = [([list(s) for s in inputs], list(made) if made else None)
                    for inputs, made in flows]
        assert read == (expected if dataflow_on else [(None, None)] * len(flows))
        wire = [json.loads(line) for line in path.read_text().splitlines()]
        assert [(d.get("from"), d.get("made")) for d in wire if d["type"] == "forward"] == [
            (None, None), ([None], None), (None, None), (None, None),
            ([[4, 2], None, 3], [3, 1])]
