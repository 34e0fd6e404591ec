"""Findings of ``hooktrace check`` as text for a person, or as JSON for a program."""

from __future__ import annotations

from collections import Counter
from typing import Any

import orjson

from hooktrace.check.findings import ERROR, NOTE, WARNING, Finding, FindingKind, Report
from hooktrace.log.words import fqn_text, plural

_TITLES = {ERROR: "Errors", WARNING: "Warnings", NOTE: "Notes"}
NOTES_SHOWN = 12  # notes printed in the text report; the rest counted (--json keeps them)
MODELS_SHOWN = 8  # models in the text report's Models block; the rest counted


def _evidence(evidence: dict[str, Any]) -> str:
    parts = []
    for key, value in evidence.items():
        if (key in ("grad_norm", "ranks") and isinstance(value, dict)) or value == [] \
                or key in ("produced", "follows", "op", "changed", "rerun"):
            continue  # listed in the message, or nothing to say
        if key in ("grad_output", "grad_input"):
            parts.append(", ".join(f"{key} {g['index']}: {g['nan']} NaN, {g['inf']} Inf"
                                   for g in value))
            continue
        if key == "outputs":  # a dtype where it is not the usual float32: a half overflows
            value = ", ".join(f"output {o['index']}" + (f" {o['shape']}" if o.get("shape") else "")
                              + (f" {o['dtype']}" if o.get("dtype") not in (None, "", "float32")
                                 else "") + f": {o['nan']} NaN, {o['inf']} Inf" for o in value)
        elif key == "profile":
            value = " -> ".join(f"{fqn_text(p['module'])} {p['grad_output_norm']:.2g}"
                                for p in _thin(value))
        parts.append(f"{key}: {value}")
    return "; ".join(parts)


def _thin(profile: list[dict[str, Any]], keep: int = 8) -> list[dict[str, Any]]:
    if len(profile) <= keep:
        return profile
    step = (len(profile) - 1) / (keep - 1)
    return [profile[round(i * step)] for i in range(keep)]


def where(f: Finding) -> str:
    """The module, model and step a finding names; a finding of no model is about the run."""
    step = f"step {f.step}" if f.step is not None else "all steps"
    if not f.model:
        if f.step is not None:
            return step
        return "the whole run" if f.cause == FindingKind.NOTHING_TRACED else "before any model ran"
    return f"{fqn_text(f.module)} · model '{f.model}' · {step}"


def _finding(f: Finding) -> list[str]:
    ranks = ""
    if f.ranks is not None:
        listed = ", ".join(map(str, f.ranks))
        ranks = f" · rank{'s' if len(f.ranks) > 1 else ''} {listed}"
        ranks += "" if f.cause == FindingKind.RANK_DIVERGENCE else " only"
    lines = [f"  [{f.cause}] {where(f)}{ranks}", f"    {f.message}"]
    evidence = _evidence(f.evidence) if f.severity != NOTE else ""  # a note's message says it
    if evidence:
        lines.append(f"    evidence: {evidence}")
    for key, label in (("op", "at"), ("changed", "output of")):
        op = f.evidence.get(key)
        if isinstance(op, dict) and op.get("line"):
            code = f": {op['code']}" if op.get("code") else ""
            lines.append(f"    {label}: {op['line']}{code}")
    if f.source:
        lines.append(f"    source: {f.source}")
    if f.hint:
        lines.append(f"    hint: {f.hint}")
    if f.evidence.get("rerun"):
        lines.append(f"    to see the operation and its line: {f.evidence['rerun']}")
    return lines


def _models(report: Report) -> list[str]:
    """The Models block: one line per model, what it was over the steps (facts, no finding)."""
    if not report.models:
        return []
    lines = ["", f"Models ({len(report.models)})"]
    lines += [f"  {m.text}" for m in report.models[:MODELS_SHOWN]]
    if len(report.models) > MODELS_SHOWN:
        lines.append(f"  ... and {len(report.models) - MODELS_SHOWN} more models "
                     "(--json lists them all)")
    return lines


def to_text(report: Report, path: str) -> str:
    lines = [f"hooktrace check {path}: {plural(report.steps, 'step')}, "
             f"{plural(report.events, 'event')}"]
    lines += [f"warning: {w}" for w in report.warnings]
    if report.captured:
        lines.append(f"captured tensors (torch.load): {report.captured}")
    lines += _models(report)
    for severity in (ERROR, WARNING, NOTE):
        found = [f for f in report.findings if f.severity == severity]
        if found:
            lines += ["", f"{_TITLES[severity]} ({len(found)})"]
            shown = found[:NOTES_SHOWN] if severity == NOTE else found
            for f in shown:
                lines += _finding(f)
            if len(shown) < len(found):
                lines.append(f"  ... and {len(found) - len(shown)} more notes "
                             "(--json lists them all)")
    n = Counter(f.severity for f in report.findings)
    noted = plural(n[NOTE], "note")
    lines.append("")
    lines.append(f"{plural(n[ERROR] + n[WARNING], 'problem')} ({plural(n[ERROR], 'error')}, "
                 f"{plural(n[WARNING], 'warning')}), {noted}" if n[ERROR] or n[WARNING] else
                 f"No problems found ({noted}).")
    return "\n".join(lines)


def to_json(report: Report) -> str:
    return orjson.dumps({
        "problems": len(report.problems), "steps": report.steps, "events": report.events,
        "warnings": report.warnings, "findings": [f.to_dict() for f in report.findings],
        "models": [m.to_dict() for m in report.models],
    }, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode()
