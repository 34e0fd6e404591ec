"""The blind bug sets judged from their logs, without tracing: every case of
``tests/bugsets/setN`` (bugs written blind from public reports, and healthy look-alikes),
traced once into ``tests/unit/logs/bugsets/setN.tar.xz`` by ``tests/bugsets/make.py``, is
checked by the library (``run_checks``, as ``hooktrace check --json`` does) and scored by the
one scorer, ``tests/bugsets/zoo.py``. Against the verdicts recorded beside the archive
(``setN.verdicts.json``):

* a DETECTED bug stays DETECTED (a warning or an error names its culprit);
* an OK healthy look-alike stays OK (no warning, no error);
* a set's count of named bugs never falls below its scorecard's.

A change may reword findings and may name more; when it names more, ``python
tests/bugsets/make.py SET --verdicts`` records the new baseline (add its scorecard below), and
the diff is reviewed. The scorecards ("before": main at 029349b, default ``hooktrace run``,
as ``zoo.py`` scores real runs; bugs named / symptom only / missed, look-alikes clean / false
alarm):

    set1  24 bugs + 6 healthy    22 / 2 / 0     6 / 0
    set2  30 bugs + 14 healthy   25 / 2 / 3    14 / 0
    set3  30 bugs + 15 healthy   16 / 3 / 11   14 / 1  (h08)
    set6  26 bugs + 19 healthy    6 / 3 / 17   15 / 4  (h03, h04, h05, h15)

Set 6's named bugs: b02, b08, b10, b11, b17, b23.

After (issue 48's first slices: kinds and causes, judged by the passes that feed a step, the
loss ledger, the parameter ledger; set 6 traced again with them):

    set3  30 bugs + 15 healthy   16 / 3 / 11   15 / 0
    set6  26 bugs + 19 healthy    8 / 2 / 16   19 / 0

Newly named: b01 (a layer's ``.grad`` set to None before every step: ``grads-cleared`` from
the parameter ledger), b03 (lr 1e1: ``loss-diverged`` from the loss ledger). No longer false
alarms: h03 (Grad-CAM), h04 (a FLOPs probe on ``torch.empty``), h05 (NaN observations masked
before the loss), h15 (a triplet loss exactly 0 in some steps: its zero gradients are the
loss's); set 3's h08 (DANN: the label logits of the unlabelled target batch, returned by the
model and let go by the caller, are no result thrown away inside a forward). b14 went from
symptom only to missed: the zero gradients it was named by come from
steps whose loss is exactly 0.

After (issue 48, causes: more bugs named by general causes of the invariants, check only):

    set2  30 bugs + 14 healthy   27 / 1 / 2    14 / 0   (b21 named since its logs were traced again)
    set6  26 bugs + 19 healthy   11 / 2 / 13   19 / 0

Newly named: b26 (one backward after a gradient-accumulation loop: ``loss-dropped``, the loss
module's calls that no backward reached, in every step), b15 (NT-Xent's labels at the masked
diagonal: ``nonfinite-forward``, a loss NaN/Inf from the ledger's first pass with every module
output and gradient finite), b24 (``kl_div`` on raw scores: ``loss-diverged`` widened to a
loss that falls below zero without slowing, one with no floor); set 2's b22 (an auxiliary
head's loss added as ``aux_loss.item()``: the ``no-grad`` is said at the head whose output the
model returned and the caller let go, not at the model), as blind_bugs4's aux_loss_item.
"""

from __future__ import annotations

import json
import tarfile
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from bugsets.zoo import VERDICTS, manifest, score

from hooktrace.check.checklog import run_checks
from hooktrace.check.report import to_json

ARCHIVES = Path(__file__).resolve().parents[1] / "logs" / "bugsets"
SETS = ("set1", "set2", "set3", "set6")

#: each set's totals by verdict, one scorecard per state of main it was scored on; a later
#: state ("after ...") is added beside the earlier ones, and the test holds the last
SCORECARDS: dict[str, dict[str, dict[str, int]]] = {
    "set1": {"before (main 029349b)": {"DETECTED": 22, "SYMPTOM-ONLY": 2, "MISSED": 0,
                                       "OK": 6, "FALSE-ALARM": 0, "ERROR": 0}},
    "set2": {"before (main 029349b)": {"DETECTED": 25, "SYMPTOM-ONLY": 2, "MISSED": 3,
                                       "OK": 14, "FALSE-ALARM": 0, "ERROR": 0},
             "re-traced (schema 3)": {"DETECTED": 26, "SYMPTOM-ONLY": 2, "MISSED": 2,
                                      "OK": 14, "FALSE-ALARM": 0, "ERROR": 0},
             "after (issue 48, causes)": {"DETECTED": 27, "SYMPTOM-ONLY": 1, "MISSED": 2,
                                          "OK": 14, "FALSE-ALARM": 0, "ERROR": 0}},
    "set3": {"before (main 029349b)": {"DETECTED": 16, "SYMPTOM-ONLY": 3, "MISSED": 11,
                                       "OK": 14, "FALSE-ALARM": 1, "ERROR": 0},
             "after (issue 48, first slices)": {"DETECTED": 16, "SYMPTOM-ONLY": 3, "MISSED": 11,
                                                "OK": 15, "FALSE-ALARM": 0, "ERROR": 0}},
    "set6": {"before (main 029349b)": {"DETECTED": 6, "SYMPTOM-ONLY": 3, "MISSED": 17,
                                       "OK": 15, "FALSE-ALARM": 4, "ERROR": 0},
             "after (issue 48, first slices)": {"DETECTED": 8, "SYMPTOM-ONLY": 2, "MISSED": 16,
                                                "OK": 19, "FALSE-ALARM": 0, "ERROR": 0},
             "after (issue 48, causes)": {"DETECTED": 11, "SYMPTOM-ONLY": 2, "MISSED": 13,
                                          "OK": 19, "FALSE-ALARM": 0, "ERROR": 0}},
}


def recorded(name: str) -> dict[str, str]:
    """The verdict of each case of set ``name`` when its baseline was written."""
    verdicts: dict[str, str] = json.loads((ARCHIVES / f"{name}.verdicts.json").read_text())
    return verdicts


def judged(name: str, folder: Path) -> dict[str, str]:
    """Today's verdict on each case of set ``name``, from its archived logs unpacked into
    ``folder``: check's report and exit status (1 when it finds problems), as zoo.py scores."""
    with tarfile.open(ARCHIVES / f"{name}.tar.xz") as tar:
        for member in tar.getmembers():
            (folder / member.name).write_bytes(tar.extractfile(member).read())  # type: ignore[union-attr]
    out = {}
    for case in manifest(name):
        result = run_checks(folder / f"{case['id']}.jsonl")
        report: dict[str, Any] = json.loads(to_json(result))
        out[case["id"]] = score(case, 1 if result.problems else 0, report)["verdict"]
    return out


def test_every_set_has_its_logs_and_verdicts() -> None:
    for name in SETS:
        with tarfile.open(ARCHIVES / f"{name}.tar.xz") as tar:
            members = tar.getnames()
        ids = [case["id"] for case in manifest(name)]
        assert members == [f"{cid}.jsonl" for cid in ids]
        assert list(recorded(name)) == ids
        last = list(SCORECARDS[name].values())[-1]
        assert Counter(recorded(name).values()) == {v: n for v, n in last.items() if n}


@pytest.mark.parametrize("name", SETS)
def test_no_set_loses_ground(name: str, tmp_path: Path) -> None:
    then, now = recorded(name), judged(name, tmp_path)
    lost = {cid: f"{then[cid]} -> {now[cid]}" for cid in then
            if then[cid] in ("DETECTED", "OK") and now[cid] != then[cid]}
    assert lost == {}, f"{name}: cases that lost their verdict: {lost}"
    named = sum(v == "DETECTED" for v in now.values())
    baseline = list(SCORECARDS[name].values())[-1]["DETECTED"]
    assert named >= baseline, f"{name}: {named} bugs named, the scorecard has {baseline}"


def write(name: str) -> None:
    """Records today's verdicts of set ``name`` as its baseline, and prints its totals."""
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        now = judged(name, Path(tmp))
    (ARCHIVES / f"{name}.verdicts.json").write_text(json.dumps(now, indent=1) + "\n")
    totals = Counter(now.values())
    print(f"{name}: " + ", ".join(f"{v} {totals[v]}" for v in VERDICTS))
