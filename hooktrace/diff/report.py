"""The report of ``hooktrace diff`` as text for a person, or as JSON for a program."""

from __future__ import annotations

from typing import Any

import orjson

from hooktrace.diff.compare import Difference, DiffReport
from hooktrace.log.words import fqn_text, plural, ranges


def _where(d: Difference) -> str:
    return f"step {d.step} · model '{d.model}' · {fqn_text(d.module)}"


def _difference(d: Difference) -> list[str]:
    return [f"   {_where(d)}", f"   {d.message}", f"   A: {d.a}", f"   B: {d.b}"]


def _ran(report: DiffReport) -> list[str]:
    lines = []
    for model, old, new in report.renamed:
        lines.append(f"   renamed: {fqn_text(old)} in A is {fqn_text(new)} in B "
                     f"(model '{model}'); compared under A's name")
    d = report.ran
    if d is not None:
        lines += [f"   {_where(d)} · position {d.position} in the step", f"   {d.message}",
                  f"   A: {d.a}", f"   B: {d.b}"]
    return [f"1. what ran: {'differs' if lines else 'the same'}", *lines]


def _shapes(report: DiffReport) -> list[str]:
    d = report.shapes
    if d is None:
        return ["2. shapes and dtypes: the same (in the calls both runs made)"]
    return [f"2. shapes and dtypes: {d.kind} differ", *_difference(d)]


def _rel(value: float | None) -> str:
    return "NaN/Inf" if value is None else f"{value:.2g}"


def _growth(profile: list[dict[str, Any]]) -> str:
    parts, last_step = [], None
    for p in profile:
        module = p["module"]
        where = "agree" if module is None else f"{fqn_text(module)} {_rel(p['relative'])}"
        if p["step"] != last_step:
            parts.append(f"step {p['step']}: {where}")
        else:
            parts[-1] += f" -> {where}"
        last_step = p["step"]
    return "; ".join(parts)


def _numbers(report: DiffReport, compared: bool) -> list[str]:
    title = f"3. numbers (rtol {report.rtol:g}, atol {report.atol:g})"
    if not compared:
        return [f"{title}: not compared"]
    d = report.divergence
    if d is None:
        return [f"{title}: agree"]
    lines = [f"{title}: first divergence", *_difference(d)]
    if report.growth:
        lines.append(f"   growth (relative difference): {_growth(report.growth)}")
    n = report.nonfinite
    if n is None:
        lines.append("   NaN/Inf in one run only: none")
    elif n is not d:
        lines += ["   NaN/Inf in one run only: first", *_difference(n)]
    return lines


def _params(report: DiffReport, compared: bool) -> list[str]:
    title = "4. parameter-gradient norms"
    if not compared:
        return [f"{title}: not compared"]
    if not report.param_steps:
        return [f"{title}: agree"]
    lines = [f"{title}: differ in {report.param_steps} of {plural(len(report.steps), 'step')}"]
    for p in report.params[:3]:
        shown = ", ".join(f"{fqn_text(name)} {_norm(a)} vs {_norm(b)}"
                          for name, a, b in p.modules)
        more = f" (and {p.count - len(p.modules)} more)" if p.count > len(p.modules) else ""
        lines.append(f"   step {p.step} · model '{p.model}': {shown}{more}")
    if report.param_steps > 3:
        rest = report.param_steps - 3
        lines.append(f"   ... {plural(rest, 'more step')}")
    return lines


def _norm(value: float | None) -> str:
    return "no gradient" if value is None else f"{value:.4g}"


def diff_text(report: DiffReport) -> str:
    steps = len(report.steps)
    lines = [f"hooktrace diff {report.a} {report.b}: {plural(steps, 'step')} "
             f"compared ({ranges(report.steps)})"]
    lines += [f"warning: {w}" for w in report.warnings]
    compared = not any(n.startswith("numbers") for n in report.not_compared)
    lines += ["", *_ran(report), *_shapes(report), *_numbers(report, compared),
              *_params(report, compared)]
    if report.not_compared:
        lines += ["", "not compared:", *(f"   {n}" for n in report.not_compared)]
    lines.append("")
    if report.differ:
        kinds = [name for name, found in (
            ("what ran", report.ran or report.renamed), ("shapes/dtypes", report.shapes),
            ("numbers", report.divergence), ("parameter gradients", report.param_steps))
            if found]
        lines.append(f"The runs differ: {', '.join(kinds)}.")
    else:
        lines.append("The runs agree.")
    return "\n".join(lines)


def diff_json(report: DiffReport) -> str:
    return orjson.dumps(report.to_dict(), option=orjson.OPT_INDENT_2).decode()
