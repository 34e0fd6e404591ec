#!/usr/bin/env python3
"""Runs a bug set under hooktrace and scores how well ``check`` names each case's culprit.

Standard library only, and the one scorer of every set (``tests/bugsets/setN/``, each with its
``manifest.json``). For each case of the set's manifest:

    $HOOKTRACE run -o $ZOO_OUT/<id>.jsonl <script>      (in the set's folder, timeout 120 s)
    $HOOKTRACE check --json $ZOO_OUT/<id>.jsonl         (timeout 120 s)

and a verdict:

    DETECTED      a bug; some error/warning finding names the culprit model and the culprit module,
                  one of its acceptable modules, or a place the case's "also" list accepts for
                  that finding's kind; "top1" when the first error/warning finding is such a one
    SYMPTOM-ONLY  a bug; error/warning findings exist, none names the culprit (e.g. the victims)
    MISSED        a bug; no error/warning finding (check exit 0)
    OK            a healthy control; check exit 0
    FALSE-ALARM   a healthy control; check exit 1
    ERROR         no usable log or check output (check exit 2, bad JSON, timeout)

For DETECTED cases the "nature" column says whether the naming finding's kind is one of the
case's acceptable kinds (`expected_kind`, `acceptable_kinds`): "kind ok" or "kind <other>".

Environment: HOOKTRACE (the hooktrace command, default ``.venv/bin/hooktrace`` of this checkout;
may hold arguments, e.g. "python -m hooktrace"), ZOO_OUT (output folder, default
``zoo-out-<set>`` in the temp directory).

    python tests/bugsets/zoo.py set6                 # every case of set 6
    python tests/bugsets/zoo.py set6 b0 h01          # cases whose id contains one of the texts
    python tests/bugsets/zoo.py set6 --jobs 2        # two cases at a time
    python tests/bugsets/zoo.py set6 --rescore       # re-check the logs in ZOO_OUT, no re-run
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

BUGSETS = Path(__file__).resolve().parent
ROOT = BUGSETS.parents[1]
PROBLEM = ("error", "warning")
VERDICTS = ("DETECTED", "SYMPTOM-ONLY", "MISSED", "OK", "FALSE-ALARM", "ERROR")
TIMEOUT = 120

Case = dict[str, Any]
Finding = dict[str, Any]


def manifest(name: str) -> list[Case]:
    """The cases of set ``name``, in the manifest's order."""
    cases: list[Case] = json.loads((BUGSETS / name / "manifest.json").read_text())
    return cases


def tool() -> list[str]:
    """The hooktrace command: $HOOKTRACE, else this checkout's virtualenv."""
    return shlex.split(os.environ.get("HOOKTRACE", str(ROOT / ".venv" / "bin" / "hooktrace")))


def run(cmd: list[str], cwd: Path, log: Path) -> tuple[int | None, float, str]:
    """Runs ``cmd``, its output to ``log``: (exit code or None on timeout, seconds, stdout)."""
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, cwd=cwd)
        code, out, err = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:
        code = None
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else ""
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else ""
        err += f"\n[zoo] timed out after {TIMEOUT} s"
    seconds = time.monotonic() - start
    log.write_text(f"$ {shlex.join(cmd)}\n[exit {code}, {seconds:.1f} s]\n--- stdout\n{out}\n"
                   f"--- stderr\n{err}")
    return code, seconds, out


def words(finding: Finding) -> set[Any]:
    """What a finding is called: its cause (the manifests' word) and its kind."""
    return {finding.get("cause"), finding.get("kind")} - {None}


def matches(finding: Finding, case: Case) -> bool:
    """The finding names the culprit: its module, an acceptable one, or a place that the case's
    "also" list accepts for a given kind only (module "*": any module of the culprit model)."""
    if finding.get("model") != case["culprit_model"]:
        return False
    module = finding.get("module")
    if module in {case["culprit_module"], *case.get("acceptable_modules", [])}:
        return True
    return any(words(finding) & set(also["kinds"]) and also["module"] in ("*", module)
               for also in case.get("also", []))


def one_line(finding: Finding | None) -> str:
    """A finding in one line: kind, severity, where, step, the start of its message."""
    if finding is None:
        return "no findings"
    step = finding.get("step")
    where = f"{finding.get('model')}:{finding.get('module') or '(root)'}"
    msg = " ".join(str(finding.get("message", "")).split())
    if len(msg) > 110:
        msg = msg[:107] + "..."
    return (f"[{finding.get('kind')}/{finding.get('severity')}] {where}"
            + (f" step {step}" if step is not None else "") + f": {msg}")


def score(case: Case, check_code: int | None, report: dict[str, Any] | None) -> dict[str, Any]:
    """The verdict on one case from check's exit code and its ``--json`` report."""
    if check_code not in (0, 1) or report is None:
        return {"verdict": "ERROR", "nature": "", "said": f"check exit {check_code}",
                "finding": None}
    findings: list[Finding] = report.get("findings", [])
    problems = [f for f in findings if f.get("severity") in PROBLEM]
    if not case["bug"]:
        verdict = "OK" if check_code == 0 else "FALSE-ALARM"
        first = problems[0] if problems else (findings[0] if findings else None)
        return {"verdict": verdict, "nature": "", "said": one_line(first), "finding": first}
    if check_code == 0 or not problems:
        first = findings[0] if findings else None
        return {"verdict": "MISSED", "nature": "", "said": one_line(first), "finding": first}
    named = [f for f in problems if matches(f, case)]
    if not named:
        return {"verdict": "SYMPTOM-ONLY", "nature": "", "said": one_line(problems[0]),
                "finding": problems[0]}
    kinds = {case.get("expected_kind"), *case.get("acceptable_kinds", [])}
    right = [f for f in named if words(f) & kinds]
    best = (right or named)[0]
    nature = "kind ok" if right else f"kind {best.get('kind')}"
    return {"verdict": "DETECTED", "nature": nature, "said": one_line(best), "finding": best,
            "top1": problems[0] is named[0]}


def trace(name: str, case: Case, out: Path) -> dict[str, Any]:
    """``hooktrace run`` of one case into ``out/<id>.jsonl``, the script named relative to its
    set's folder (so the log holds no path of this machine)."""
    log = out / f"{case['id']}.jsonl"
    log.unlink(missing_ok=True)
    code, seconds, _ = run([*tool(), "run", "-o", str(log), case["script"]], BUGSETS / name,
                           out / f"{case['id']}.run.txt")
    return {"run_exit": code, "run_seconds": round(seconds, 1),
            "run_exit_as_expected": code == case.get("script_exit", 0)}


def do_case(name: str, case: Case, out: Path, rescore: bool) -> dict[str, Any]:
    """Traces (unless ``rescore``) and checks one case: its result."""
    cid = case["id"]
    result: dict[str, Any] = {"id": cid, "class": case["class"], "bug": case["bug"]}
    if not rescore:
        result.update(trace(name, case, out))
    log = out / f"{cid}.jsonl"
    if not log.exists():
        result.update(verdict="ERROR", nature="", said="no log written", finding=None)
        return result
    code, _, stdout = run([*tool(), "check", "--json", str(log)], BUGSETS / name,
                          out / f"{cid}.check.txt")
    result["check_exit"] = code
    report = None
    with contextlib.suppress(ValueError):
        report = json.loads(stdout)
    result.update(score(case, code, report))
    result["findings"] = report.get("findings", []) if report else []
    return result


def summarize(results: list[dict[str, Any]]) -> list[str]:
    """The scorecard's closing lines: per class, then the totals."""
    lines = ["", "summary by class", f"  {'class':36} {'verdict':12} nature"]
    lines += [f"  {r['class']:36} {r['verdict']:12} {r['nature']}"
              for r in sorted(results, key=lambda r: (not r["bug"], r["class"]))]
    totals = {v: sum(r["verdict"] == v for r in results) for v in VERDICTS}
    bugs = [r for r in results if r["bug"]]
    right_kind = sum(r["verdict"] == "DETECTED" and r["nature"] == "kind ok" for r in bugs)
    top1 = sum(bool(r.get("top1")) for r in bugs)
    lines.append("\ntotals: " + ", ".join(f"{v} {n}" for v, n in totals.items()
                                          if n or v != "ERROR"))
    lines.append(f"bugs: {totals['DETECTED']}/{len(bugs)} detected ({right_kind} with the right "
                 f"kind), {top1} first among the problems, {totals['SYMPTOM-ONLY']} symptom "
                 f"only, {totals['MISSED']} missed; healthy: {totals['OK']}/"
                 f"{len(results) - len(bugs)} clean, {totals['FALSE-ALARM']} false alarms")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("set", help="the set's folder name under tests/bugsets, e.g. set6")
    parser.add_argument("only", nargs="*", help="run the cases whose id contains one of these")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--rescore", action="store_true",
                        help="only re-run check on the logs already in ZOO_OUT")
    args = parser.parse_args()

    cases = manifest(args.set)
    if args.only:
        cases = [c for c in cases if any(text in c["id"] for text in args.only)]
    default = Path(tempfile.gettempdir()) / f"zoo-out-{args.set}"
    out = Path(os.environ.get("ZOO_OUT", default)).resolve()
    out.mkdir(parents=True, exist_ok=True)
    print(f"zoo {args.set}: {len(cases)} cases, tool: {shlex.join(tool())}, output: {out}",
          flush=True)

    def work(case: Case) -> dict[str, Any]:
        result = do_case(args.set, case, out, args.rescore)
        exit_note = "" if result.get("run_exit_as_expected", True) else \
            f"  (script exit {result.get('run_exit')}, expected {case.get('script_exit', 0)})"
        print(f"{result['id']:34} {result['class']:36} {result['verdict']:12} "
              f"{result['nature']:22} {result['said']}{exit_note}", flush=True)
        return result

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = list(pool.map(work, cases))
    print("\n".join(summarize(results)))
    summary = {"set": args.set, "tool": shlex.join(tool()), "out": str(out), "cases": results,
               "totals": {v: sum(r["verdict"] == v for r in results) for v in VERDICTS}}
    path = out / ("results.partial.json" if args.only else "results.json")
    path.write_text(json.dumps(summary, indent=1))
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
