"""`bench gate`'s outputs: the Markdown table (stdout, `--markdown`), JUnit XML (`--junit-xml`) and JSON (`--json`),
one row / test case / object per (point, metric) comparison of reports/gate.py."""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET
from dataclasses import asdict
from pathlib import Path
from typing import Any

from reports.gate import FAILURE_RATE, SATURATED, Comparison, GateResult
from reports.gate_goodput import is_goodput
from reports.gate_slo import is_attainment
from reports.recompute import format_slo


def _pct(x: float) -> str:
    return "–" if math.isnan(x) else ("+inf" if math.isinf(x) else f"{x * 100:+.1f}%")


def _value(c: Comparison, x: float) -> str:
    if c.metric == SATURATED:
        return "skipped" if math.isnan(x) else "saturated" if x else "not saturated"
    if is_attainment(c.metric):
        return f"{x * 100:.1f}% met"
    if is_goodput(c.metric):
        return f"{x:.3g} req/s"
    return f"{x * 100:.1f}% failed" if c.metric == FAILURE_RATE else f"{x:.2f} ms"


def _change(c: Comparison, x: float) -> str:
    in_points = c.metric == FAILURE_RATE or is_attainment(c.metric)
    return f"{x * 100:+.1f} pp" if in_points and not math.isnan(x) else _pct(x)


def to_markdown(result: GateResult, baseline_name: str, candidate_name: str) -> str:
    cfg = result.config
    verdict = "PASS" if result.passed else "FAIL"
    lines = [
        f"### bench gate: {verdict}",
        "",
        f"Baseline `{baseline_name}` vs candidate `{candidate_name}`; fails on a regression above "
        f"{cfg.max_regression:.1%} that is significant at alpha={cfg.alpha} (Holm-adjusted over "
        f"{len(result.comparisons)} tests; {cfg.n_boot} bootstrap resamples, seed {cfg.seed}). "
        f"failure_rate fails on a significant increase above {cfg.max_failure_increase * 100:g} percentage points. "
        + (f"slo_attainment (SLO: {format_slo(cfg.slo)}) fails on a significant drop above "
           f"{cfg.max_attainment_drop * 100:g} percentage points, request_goodput (requests/s meeting it) on a "
           f"significant drop above {cfg.max_goodput_drop:.1%}. " if cfg.slo else "")
        + f"Repeats: baseline {result.repeats[0]}, candidate {result.repeats[1]}.",
        "",
        *[f"> ⚠️ {note}" for note in result.notes],
        *([""] if result.notes else []),
        f"| point | metric | baseline | candidate | change | {100 * (1 - cfg.alpha):g}% CI | p (Holm) | n base/cand "
        "| result |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in result.comparisons:
        status = "❌ regression" if c.failed else ("✅ pass" + (f" ({c.note})" if c.note else ""))
        if c.failed and c.note:
            status += f" ({c.note})"
        p = "–" if math.isnan(c.p_adjusted) else f"{c.p_adjusted:.3g}"
        lines.append(
            f"| {c.point} | {c.metric} | {_value(c, c.baseline)} | {_value(c, c.candidate)} | {_change(c, c.change)} | "
            f"[{_change(c, c.ci_low)}, {_change(c, c.ci_high)}] | {p} | {c.n_baseline}/{c.n_candidate} | {status} |"
        )
    return "\n".join(lines) + "\n"


def write_junit(result: GateResult, path: Path) -> Path:
    """JUnit XML: one test case per (metric, point); a failed case carries the figures."""
    failures = sum(c.failed for c in result.comparisons)
    suites = ET.Element("testsuites", name="bench gate", tests=str(len(result.comparisons)), failures=str(failures))
    suite = ET.SubElement(suites, "testsuite", name="bench gate", tests=str(len(result.comparisons)),
                          failures=str(failures), errors="0", skipped="0")
    for c in result.comparisons:
        case = ET.SubElement(suite, "testcase", classname=f"gate.{c.point}", name=c.metric, time="0")
        summary = (f"{c.metric} at {c.point}: {_value(c, c.baseline)} -> {_value(c, c.candidate)} "
                   f"({_change(c, c.change)}, CI [{_change(c, c.ci_low)}, {_change(c, c.ci_high)}], "
                   f"Holm p={c.p_adjusted:.3g}) {c.note}").strip()
        if c.failed:
            message = f"regression {_change(c, c.change)}"
            ET.SubElement(case, "failure", message=message, type="regression").text = summary
        else:
            ET.SubElement(case, "system-out").text = summary
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(suites).write(path, encoding="utf-8", xml_declaration=True)
    return path


def _number(x: float) -> float | str | None:
    """JSON has no NaN or infinity: NaN -> null, infinities -> "inf" / "-inf"."""
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, float) and math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


def to_json(result: GateResult, baseline_name: str, candidate_name: str) -> dict[str, Any]:
    """The verdict as one object: `passed`, both runs, the gate's config, repeats, notes and every comparison
    (`point`, `metric`, `baseline`, `candidate`, `change`, `ci_low`, `ci_high`, `p_value`, `p_adjusted`,
    `n_baseline`, `n_candidate`, `failed`, `note`, `noise_floor`) with the units of its metric (`unit`)."""
    rows = []
    for c in result.comparisons:
        row = {key: _number(value) for key, value in asdict(c).items()}
        row["unit"] = _unit(c.metric)
        rows.append(row)
    return {
        "passed": result.passed,
        "baseline": baseline_name,
        "candidate": candidate_name,
        "config": {key: _number(value) for key, value in asdict(result.config).items()},
        "repeats": {"baseline": result.repeats[0], "candidate": result.repeats[1]},
        "notes": list(result.notes),
        "comparisons": rows,
    }


def _unit(metric: str) -> str:
    if metric == SATURATED:
        return "saturated (1) or not (0)"
    if is_attainment(metric):
        return "share met; change in absolute share"
    if metric == FAILURE_RATE:
        return "share failed; change in absolute share"
    if is_goodput(metric):
        return "requests/s; change relative"
    return "ms; change relative"


def write_json(result: GateResult, baseline_name: str, candidate_name: str, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(to_json(result, baseline_name, candidate_name), indent=2) + "\n")
    return path
