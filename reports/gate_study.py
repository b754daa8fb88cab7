"""`bench lab gate-study`: the gate's false-alarm and detection rates, measured on real interleaved A/B runs.

Procedure (docs/GATE.md):
1. A/A: `--aa-trials` runs of `bench compare --together` with both targets the same git ref.
2. Detection: for each nominal slow-down s in `--regressions`, `--detection-trials` such runs whose
   candidate serves with `--inject-step-delay-ms d`, d = s x the A/A runs' typical median TPOT (the median over
   points), so the points' TPOT is slowed by about s (the realised change per point is reported too).
3. Analysis: every trial is gated again under each gate variant (repeats used, prompts used per repeat,
   threshold) by taking subsets of its requests (the first r repeats, the first n requests of each), so all
   variants are judged on the same runs. A variant's cost is the sweep time of the requests it uses, plus the
   trial's fixed overhead (server start-up, calibration).

Trials are appended to `trials.jsonl` as they finish; `--resume` continues a study, `--analyse-only` re-reads it.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from reports.gate import FAILURE_RATE, Comparison, GateConfig, GateResult, run_gate
from reports.importers import RunData, load_run
from sweep.compare.rounds import CompareConfig, run_compare
from sweep.compare.targets import Target

if TYPE_CHECKING:  # the sweep config module loads the HTTP client, which the gate never needs
    from sweep.run.sweep_config import SweepConfig

TRIALS_FILE = "trials.jsonl"


@dataclass(frozen=True)
class GateStudyConfig:
    sweep: SweepConfig  # the trial's `bench compare` sweep: loads, prompts, repeats (the most any variant uses), model
    ref: str = "HEAD"
    aa_trials: int = 20
    detection_trials: int = 8
    regressions: tuple[float, ...] = (0.10, 0.20, 0.40)
    thresholds: tuple[float, ...] = (0.05, 0.10, 0.15, 0.20)
    metrics: tuple[str, ...] = ("ttft_p90", "tpot_p50", "e2el_p90", "failure_rate")
    alpha: float = 0.05

    def __post_init__(self) -> None:
        if self.aa_trials < 1 or self.detection_trials < 0:
            raise ValueError("--aa-trials must be >= 1 and --detection-trials >= 0")
        if any(not 0 < s < 10 for s in self.regressions) or any(not 0 <= t < 10 for t in self.thresholds):
            raise ValueError("--regressions must be in (0%, 1000%) and --max-regressions in [0%, 1000%)")
        if self.sweep.num_prompts is None or self.sweep.num_prompts < 10:
            raise ValueError("a gate study needs --num-prompts >= 10 (its variants use half of them)")


@dataclass(frozen=True)
class GateVariant:
    repeats: int
    num_prompts: int
    max_regression: float

    @property
    def name(self) -> str:
        return f"R={self.repeats}, n={self.num_prompts}, >{self.max_regression:.0%}"


def variants(study: GateStudyConfig) -> list[GateVariant]:
    """Every (repeats 1..R) x (prompts N/2, N) x threshold the study's trials can answer."""
    full = study.sweep.num_prompts or 0
    return [
        GateVariant(r, n, t)
        for r in range(1, study.sweep.repeats + 1)
        for n in sorted({full // 2, full})
        for t in study.thresholds
    ]


def read_trials(out: Path) -> list[dict[str, Any]]:
    path = out / TRIALS_FILE
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _append_trial(out: Path, trial: dict[str, Any]) -> None:
    with open(out / TRIALS_FILE, "a") as f:
        f.write(json.dumps(trial) + "\n")


def typical_median_tpot_ms(run_dirs: list[Path]) -> float:
    """The median over points of each point's median TPOT, pooled (median) over the given runs."""
    tpots: dict[str, list[float]] = {}
    for run_dir in run_dirs:
        points = load_run(run_dir).points
        for label, tpot in zip(points["label"], points["median_tpot_ms"], strict=True):
            tpots.setdefault(label, []).append(float(tpot))
    if not tpots:
        raise ValueError("no A/A trial to size the injected delays from")
    return float(np.median([np.median(v) for v in tpots.values()]))


def _planned(study: GateStudyConfig) -> Iterator[tuple[float, int]]:
    yield from ((0.0, k) for k in range(study.aa_trials))
    for s in study.regressions:
        yield from ((s, k) for k in range(study.detection_trials))


def run_trials(study: GateStudyConfig, log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Run every planned trial not yet in trials.jsonl (A/A first: the delays are sized from them)."""
    out = study.sweep.output_dir
    out.mkdir(parents=True, exist_ok=True)
    (out / "study.json").write_text(json.dumps({
        "ref": study.ref, "aa_trials": study.aa_trials, "detection_trials": study.detection_trials,
        "regressions": list(study.regressions), "command": study.sweep.command,
    }, indent=2))
    trials = read_trials(out)
    done = {(t["regression"], t["trial"]) for t in trials}
    plan = list(_planned(study))
    for n, (regression, k) in enumerate(plan, 1):
        if (regression, k) in done:
            continue
        delay = 0.0 if regression == 0.0 else round(regression * typical_median_tpot_ms(
            [out / t["dir"] / "baseline" for t in trials if t["regression"] == 0.0]), 3)
        tag = f"{'aa' if regression == 0.0 else f'slow{regression * 100:g}'}/t{k:02d}"
        shutil.rmtree(out / tag, ignore_errors=True)  # an interrupted trial starts over
        log(f"trial {n}/{len(plan)}: {tag} (inject {delay} ms per step)")
        start = time.perf_counter()
        candidate = {"inject_step_delay_ms": delay} if delay else {}
        run_compare(CompareConfig(
            replace(study.sweep, output_dir=out / tag, resume=False),
            [Target("baseline", "ref", study.ref), Target("candidate", "ref", study.ref, candidate)],
            together=True,
        ))  # fmt: skip
        trial = {"regression": regression, "trial": k, "delay_ms": delay, "dir": tag,
                 "wall_s": round(time.perf_counter() - start, 2), "loadavg": _loadavg()}
        _append_trial(out, trial)
        trials.append(trial)
    return trials


def _loadavg() -> float | None:
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def subset(run: RunData, repeats: int, num_prompts: int) -> RunData:
    """The run as if it had been measured with fewer repeats and fewer requests per repeat."""
    rows = run.requests
    keep = rows["index"] < num_prompts
    if "repeat" in rows and rows["repeat"].notna().any():
        keep &= rows["repeat"] < repeats
    return RunData(run.name, run.points, rows[keep], run.config, run.source)


def _sweep_seconds(run: RunData, repeats: int, num_prompts: int, full_prompts: int) -> float:
    """The sweep time a variant's requests took: each used repeat's point duration, scaled by the share used."""
    if "repeats" not in run.points:
        return float(run.points["duration"].sum()) * num_prompts / full_prompts
    total = sum(float(r["duration"]) for repeat_list in run.points["repeats"] for r in repeat_list[:repeats])
    return total * num_prompts / full_prompts


def _by_subset(all_variants: list[GateVariant]) -> dict[tuple[int, int], list[GateVariant]]:
    groups: dict[tuple[int, int], list[GateVariant]] = {}
    for variant in all_variants:
        groups.setdefault((variant.repeats, variant.num_prompts), []).append(variant)
    return groups


def _failed(result: GateResult, max_regression: float) -> list[Comparison]:
    """The comparisons that fail at this threshold. The bootstrap, p-values and Holm adjustment do not depend on
    the threshold, so one gate run (at threshold 0) answers every threshold."""
    limit = result.config.max_failure_increase
    return [
        c for c in result.comparisons
        if (c.note.startswith("candidate has only") and c.failed)
        or (c.p_adjusted <= result.config.alpha
            and c.change > (limit if c.metric == FAILURE_RATE else max_regression))
    ]


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score 95 % interval of a binomial proportion k/n."""
    if n == 0:
        return math.nan, math.nan
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def analyse(study: GateStudyConfig, trials: list[dict[str, Any]]) -> dict[str, Any]:
    """Gate every trial under every variant; the verdict rates, their intervals and the variants' cost."""
    out = study.sweep.output_dir
    full = study.sweep.num_prompts or 0
    outcomes: dict[str, dict[float, list[bool]]] = {}
    alarms: dict[str, list[str]] = {}
    minutes: dict[str, list[float]] = {}
    realised: dict[float, dict[str, list[float]]] = {}
    for trial in trials:
        base, cand = (load_run(out / trial["dir"] / side) for side in ("baseline", "candidate"))
        sweep_s = sum(_sweep_seconds(run, study.sweep.repeats, full, full) for run in (base, cand))
        fixed_s = max(0.0, trial["wall_s"] - sweep_s)
        tpots = base.points.set_index("label")["median_tpot_ms"].to_frame("b").join(
            cand.points.set_index("label")["median_tpot_ms"].rename("c"))
        for label, b, c in tpots.itertuples():
            realised.setdefault(trial["regression"], {}).setdefault(label, []).append(float(c) / float(b) - 1)
        for (repeats, num_prompts), group in _by_subset(variants(study)).items():
            config = GateConfig(metrics=study.metrics, max_regression=0.0, alpha=study.alpha)
            result = run_gate(subset(base, repeats, num_prompts), subset(cand, repeats, num_prompts), config)
            used_s = sum(_sweep_seconds(run, repeats, num_prompts, full) for run in (base, cand))
            for variant in group:
                failed = _failed(result, variant.max_regression)
                outcomes.setdefault(variant.name, {}).setdefault(trial["regression"], []).append(bool(failed))
                if trial["regression"] == 0.0 and failed:
                    alarms.setdefault(variant.name, []).extend(
                        f"{trial['dir']}: {c.point} {c.metric} {c.change:+.1%}" for c in failed
                    )
                minutes.setdefault(variant.name, []).append((used_s + fixed_s) / 60)
    rows = []
    for variant in variants(study):
        by_level = outcomes.get(variant.name, {})
        row: dict[str, Any] = {"variant": variant.name, "repeats": variant.repeats, "num_prompts": variant.num_prompts,
                               "max_regression": variant.max_regression,
                               "minutes_per_job": float(np.mean(minutes[variant.name])) if variant.name in minutes
                               else None, "false_alarms": alarms.get(variant.name, [])}
        for level, fails in sorted(by_level.items()):
            low, high = wilson(sum(fails), len(fails))
            row[f"fail_{level:g}"] = {"failed": sum(fails), "trials": len(fails), "rate": sum(fails) / len(fails),
                                      "ci95": [low, high]}
        rows.append(row)
    summary = {
        "trials": len(trials),
        "loadavg": [t.get("loadavg") for t in trials],
        "delays_ms": {f"{t['regression']:g}": t["delay_ms"] for t in trials},
        "realised_tpot_p50_change": {f"{lvl:g}": {label: float(np.median(v)) for label, v in points.items()}
                                     for lvl, points in sorted(realised.items())},
        "variants": rows,
    }
    (out / "gate_study.json").write_text(json.dumps(summary, indent=2))
    (out / "gate_study.md").write_text(to_markdown(summary, study.regressions))
    return summary


def _rate(cell: dict[str, Any] | None) -> str:
    if not cell:
        return "-"
    low, high = cell["ci95"]
    return f"{cell['failed']}/{cell['trials']} ({cell['rate']:.0%}; {low:.0%}-{high:.0%})"


def to_markdown(summary: dict[str, Any], regressions: tuple[float, ...]) -> str:
    """The study's table: one row per gate variant."""
    levels = [0.0, *regressions]
    head = ["gate variant", "A/A false alarms", *(f"detects {s:.0%}" for s in regressions), "min per CI job"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in summary["variants"]:
        cells = [_rate(row.get(f"fail_{level:g}")) for level in levels]
        cost = f"{row['minutes_per_job']:.1f}" if row["minutes_per_job"] is not None else "-"
        lines.append(f"| {row['variant']} | " + " | ".join(cells) + f" | {cost} |")
    realised = summary["realised_tpot_p50_change"]
    lines += ["", "Realised median-TPOT change per point (median over trials): " + "; ".join(
        f"{float(level):.0%} nominal: " + ", ".join(f"{label} {v:+.1%}" for label, v in points.items())
        for level, points in realised.items()
    )]
    return "\n".join(lines) + "\n"
