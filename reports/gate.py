"""`bench gate`: a noise-aware regression gate between a baseline run and a candidate run.

Per point and metric (e.g. `tpot_p50`), the per-request distributions are resampled (seeded, vectorised
percentile bootstrap; hierarchical over repeats and then requests when a run has `--repeats`, with a between-
run noise floor for a side measured once, see reports/gate_noise.py; ITL over pooled chunk gaps) to get the
relative change of the statistic, candidate / baseline - 1, with its confidence interval and a one-sided
bootstrap p-value for "the candidate is slower". P-values are Holm-adjusted over every (point, metric) test of
the gate so the chance of any false alarm stays at `alpha`. A test fails only when the regression is
significant (adjusted p <= alpha) AND its point estimate exceeds `max_regression`. Latency metrics are
relative changes; `failure_rate` compares the share of failed requests (one-sided Fisher exact test) and fails
on a significant increase above `max_failure_increase` percentage points, so a candidate cannot pass by
failing its slow requests. A rate point the candidate over-saturated (sweep.point.saturation) fails as `saturated`
unless the baseline saturated there too, and so does a point the candidate skipped because a lower load saturated
(`--stop-when-saturated`): past capacity its latencies measure a queue, so the load itself is the regression.
With an SLO (`--slo`, per-token and per-class keys included) every point also gets `slo_attainment` rows, overall
and per request class (reports/gate_slo.py), that fail on a significant drop above `max_attainment_drop`, and
`request_goodput` rows (requests/s that met the SLO, reports/gate_goodput.py), bootstrapped like the latency rows,
that fail on a significant relative drop above `max_goodput_drop`. reports/gate_output.py writes the verdict.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from reports.gate_goodput import GOODPUT, goodput_groups, goodput_metric, is_goodput
from reports.gate_noise import calibration_gap, history_noise_floor, statistic
from reports.gate_slo import ATTAINMENT, attainment_tests, gate_classes, is_attainment
from reports.gate_stats import compare_failures, compare_groups, holm
from reports.importers import RunData
from reports.recompute import LATENCY_METRICS, cancelled_mask, pooled_itl_ms, request_latencies
from sweep.point.saturation import is_saturated

# Workload keys allowed to differ between baseline and candidate: the per-run prompt salt exists
# precisely so reruns do not share a warm prefix cache.
IGNORED_WORKLOAD_KEYS = frozenset({"salt"})
FAILURE_RATE = "failure_rate"
SATURATED = "saturated"  # not a --metric: added wherever either run marks a point saturated or skips one


class GateInputError(ValueError):
    """The runs cannot be compared (exit code 2)."""


@dataclass(frozen=True)
class GateConfig:
    metrics: tuple[str, ...] = ("ttft_p90", "tpot_p50", FAILURE_RATE)
    max_regression: float = 0.05  # fraction: 0.05 = 5 %
    alpha: float = 0.05
    n_boot: int = 2000
    seed: int = 0
    min_samples: int = 5
    max_failure_increase: float = 0.0  # absolute, for `failure_rate`: 0.01 = one percentage point
    noise_floor: float | None = None  # relative SD between runs, for a side measured once (see gate_noise.py)
    check_workload: bool = True  # off to compare across tools, whose workload records differ
    slo: dict[str, float] | None = None  # ms, sweep keys (parse_slo): adds slo_attainment rows (reports/gate_slo.py)
    max_attainment_drop: float = 0.0  # absolute, for the slo_attainment rows: 0.02 = two percentage points
    max_goodput_drop: float = 0.05  # relative, for the request_goodput rows (with an slo): 0.05 = 5 %


@dataclass
class Comparison:
    point: str
    metric: str
    baseline: float
    candidate: float
    change: float  # latency: candidate / baseline - 1; failure_rate: candidate - baseline
    ci_low: float
    ci_high: float
    p_value: float
    n_baseline: int
    n_candidate: int
    p_adjusted: float = math.nan
    failed: bool = False
    note: str = ""
    noise_floor: float | None = None


@dataclass
class GateResult:
    config: GateConfig
    comparisons: list[Comparison] = field(default_factory=list)
    repeats: tuple[int, int] = (1, 1)  # baseline, candidate
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not any(c.failed for c in self.comparisons)


def valid_metrics() -> str:
    """Every gate metric spelling, for help texts and errors."""
    return (
        "ttft_<stat>, tpot_<stat>, itl_<stat> (every chunk gap, pooled: vLLM's ITL), e2el_<stat>, "
        "itl_p99_<stat> (each request's own p99 chunk gap, the itl_p99 SLO's quantity), max_stall_<stat> (each "
        "request's longest chunk gap, the max_stall SLO's), with <stat> = mean, median or pNN over the requests "
        f"(e.g. tpot_p50, itl_p99_p95, max_stall_p99); or {FAILURE_RATE}"
    )


def parse_metric(spec: str) -> tuple[str, str | float]:
    """`ttft_p90` -> ("ttft", 90.0); `tpot_p99.9`; `e2el_median` -> 50.0; `itl_mean` -> "mean";
    the per-request gap metrics, named by their SLO key and then a statistic over the requests: `itl_p99_p95` ->
    ("itl_p99", 95.0) (the p95 of each request's own p99 chunk gap; plain `itl_p99` is the pooled ITL's p99) and
    `max_stall_p99` -> ("max_stall", 99.0) (each request's longest chunk gap);
    `failure_rate` -> ("failure_rate", "rate")."""
    text = spec.strip().lower()
    if text == FAILURE_RATE:
        return FAILURE_RATE, "rate"
    # a full match is unambiguous: itl_p99_p95 is the per-request itl_p99's p95, itl_p99 the pooled ITL's p99
    match = re.fullmatch(rf"({'|'.join(LATENCY_METRICS)})_(mean|median|p\d+(?:\.\d+)?)", text)
    if not match:
        rows = text.startswith((GOODPUT, ATTAINMENT))
        hint = " (request_goodput and slo_attainment rows come with --slo)" if rows else ""
        raise GateInputError(f"unknown gate metric {spec!r}: the gate metrics are {valid_metrics()}{hint}")
    name, stat = match.groups()
    if stat == "mean":
        return name, "mean"
    q = 50.0 if stat == "median" else float(stat[1:])
    if not 0 <= q <= 100:
        raise GateInputError(f"percentile out of range in {spec!r}")
    return name, q


def parse_threshold(text: str) -> float:
    """`5%` -> 0.05; `0.05` -> 0.05."""
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100.0 if raw.endswith("%") else float(raw)
    except ValueError:
        raise GateInputError(f"bad threshold {text!r}: use e.g. 5% or 0.05") from None
    if not 0 <= value < 10:
        raise GateInputError(f"bad threshold {text!r}: must be between 0% and 1000%")
    return value


def metric_samples(run: RunData, label: str, names: set[str]) -> dict[str, np.ndarray]:
    """Per-request values in ms (successful requests; TPOT only for outputs of 2+ tokens, MAX_STALL of 2+ chunks;
    ITL pooled gaps)."""
    rows = run.point_requests(label)
    samples = {}
    if names - {"itl"}:
        latencies = request_latencies(rows)
        for name in names - {"itl"}:
            values = latencies[f"{name}_ms"].to_numpy(dtype=float)
            samples[name] = values[~np.isnan(values)]
    if "itl" in names:
        samples["itl"] = pooled_itl_ms(rows)
    return samples


def metric_groups(run: RunData, label: str, names: set[str]) -> dict[str, list[np.ndarray]]:
    """Per-request values in ms, one array per repeat (one array for a run without repeats)."""
    rows = run.point_requests(label)
    if "repeat" not in rows or rows["repeat"].isna().all():
        return {name: [values] for name, values in metric_samples(run, label, names).items()}
    groups: dict[str, list[np.ndarray]] = {name: [] for name in names}
    for _, repeat_rows in rows.groupby("repeat", sort=True):
        part = RunData(run.name, run.points, repeat_rows, run.config, run.source)
        for name, values in metric_samples(part, label, names).items():
            if values.size:
                groups[name].append(values)
    return groups


def check_comparable(baseline: RunData, candidate: RunData, check_workload: bool = True) -> list[str]:
    """Raise GateInputError when workloads or points differ; returns the shared point labels in order."""
    if check_workload:
        _check_workloads(baseline, candidate)
    if baseline.mode != candidate.mode:
        raise GateInputError(f"baseline sweeps {baseline.mode} but candidate sweeps {candidate.mode}")
    base_labels, cand_labels = list(baseline.points["label"]), list(candidate.points["label"])
    missing = sorted(set(base_labels) - set(cand_labels) - _skipped(candidate))  # a skipped one fails as saturated
    extra = sorted(set(cand_labels) - set(base_labels) - _skipped(baseline))
    if missing or extra:
        raise GateInputError(f"the runs have different points: missing in candidate {missing}, extra {extra}")
    return [label for label in base_labels if label in set(cand_labels)]


def _skipped(run: RunData) -> set[str]:
    return {str(entry.get("label")) for entry in run.skipped}


def saturation_comparisons(baseline: RunData, candidate: RunData) -> list[Comparison]:
    """One `saturated` comparison per point either run saturated or skipped; it fails where the candidate
    saturated (or skipped the point) and the baseline did not. Empty when neither run marks any point."""
    def marked(run: RunData) -> dict[str, bool]:
        return {str(p["label"]): is_saturated(p) for p in run.points.to_dict("records")}

    base, cand = marked(baseline), marked(candidate)
    comparisons = []
    for label in base:
        skipped = label in _skipped(candidate)
        if not (base[label] or cand.get(label) or skipped) or (label not in cand and not skipped):
            continue
        worse = not base[label] and (skipped or cand[label])
        if skipped:
            note = "candidate skipped it: a lower load saturated"
        elif base[label] and cand[label]:
            note = "saturated in both runs"
        else:
            note = "candidate saturated, baseline did not" if cand[label] else "baseline saturated, candidate did not"
        value = math.nan if skipped else float(cand[label])
        comparisons.append(Comparison(label, SATURATED, float(base[label]), value, math.nan, math.nan, math.nan,
                                      math.nan, 0, 0, failed=worse, note=note))
    return comparisons


def _check_workloads(baseline: RunData, candidate: RunData) -> None:
    base_work = {k: v for k, v in (baseline.config.get("workload") or {}).items() if k not in IGNORED_WORKLOAD_KEYS}
    cand_work = {k: v for k, v in (candidate.config.get("workload") or {}).items() if k not in IGNORED_WORKLOAD_KEYS}
    if base_work != cand_work:
        diff = sorted(k for k in base_work.keys() | cand_work.keys() if base_work.get(k) != cand_work.get(k))
        details = ", ".join(f"{k}: {base_work.get(k)!r} vs {cand_work.get(k)!r}" for k in diff)
        raise GateInputError(
            f"the runs used different workloads ({details}); rerun the candidate with the same flags "
            "(or pass --ignore-workload to compare runs of different tools)"
        )


def num_repeats(run: RunData) -> int:
    """How many repeats (`bench sweep --repeats`) the run's requests come from."""
    if "repeat" not in run.requests or run.requests["repeat"].isna().all():
        return 1
    return int(run.requests["repeat"].nunique())


def _history_key(name: str, stat: str | float) -> str:
    return f"{name}_{'mean' if stat == 'mean' else 'median' if stat == 50.0 else f'p{stat:g}'}"


def _workload(config: dict) -> dict:
    return {k: v for k, v in (config.get("workload") or {}).items() if k not in IGNORED_WORKLOAD_KEYS}


def run_gate(baseline: RunData, candidate: RunData, config: GateConfig, store: Path | None = None) -> GateResult:
    """Compare two runs. `store` (a baseline store) supplies the noise floor from its blessed history when a side
    has one repeat and `config.noise_floor` is not set."""
    labels = check_comparable(baseline, candidate, config.check_workload)
    metrics = [(spec, *parse_metric(spec)) for spec in config.metrics]
    classes = gate_classes(baseline, candidate, config.slo) if config.slo else []
    # The smallest bootstrap p-value is 1/(n_boot+1); Holm multiplies it by the number of tests (with an SLO, an
    # attainment and a goodput row per point and class), so keep enough resamples that a clear regression can
    # still reach significance.
    tests = len(metrics) + (2 * (1 + len(classes)) if config.slo else 0)
    needed = math.ceil(4 * len(labels) * tests / config.alpha)
    config = replace(config, n_boot=max(config.n_boot, needed))
    rng = np.random.default_rng(config.seed)
    result = GateResult(config, repeats=(num_repeats(baseline), num_repeats(candidate)))
    names = {name for _, name, _ in metrics} - {FAILURE_RATE}
    base_workload = _workload(baseline.config)
    unwidened = []
    for label in labels:
        base_groups = metric_groups(baseline, label, names)
        cand_groups = metric_groups(candidate, label, names)
        for spec, name, stat in metrics:
            if name == FAILURE_RATE:
                # requests the client cancelled on purpose (--cancel-rate) are neither failures nor trials
                sides = (baseline.point_requests(label), candidate.point_requests(label))
                base_rows, cand_rows = (rows[~cancelled_mask(rows)] for rows in sides)
                counts = [int((~rows["success"].astype(bool)).sum()) for rows in (base_rows, cand_rows)]
                values = compare_failures(counts[0], len(base_rows), counts[1], len(cand_rows), config.alpha)
                result.comparisons.append(Comparison(label, spec, *values, len(base_rows), len(cand_rows)))
                continue
            base = np.concatenate(base_groups[name] or [np.empty(0)])
            cand = np.concatenate(cand_groups[name] or [np.empty(0)])
            if base.size < config.min_samples:
                raise GateInputError(
                    f"baseline point {label} has {base.size} {name.upper()} samples; "
                    f"at least {config.min_samples} are needed"
                )
            if cand.size < config.min_samples:
                result.comparisons.append(Comparison(label, spec, float(statistic(base, stat)), math.nan, math.inf,
                                                     math.nan, math.nan, 0.0, base.size, cand.size, failed=True,
                                                     note=f"candidate has only {cand.size} successful samples"))
                continue
            floor = None
            if 1 in (len(base_groups[name]), len(cand_groups[name])):
                floor = config.noise_floor
                if floor is None and store is not None:
                    found = history_noise_floor(
                        store, label, _history_key(name, stat), lambda c: _workload(c) == base_workload
                    )
                    floor = found[0] if found else None
                if floor is None:
                    unwidened.append(f"{label} {spec}")
            values = compare_groups(base_groups[name], cand_groups[name], stat, config, rng, floor)
            result.comparisons.append(
                Comparison(label, spec, *values, n_baseline=base.size, n_candidate=cand.size, noise_floor=floor)
            )
    for label, spec, values, n_base, n_cand in attainment_tests(baseline, candidate, labels, config.slo or {},
                                                                 config.alpha):
        result.comparisons.append(Comparison(label, spec, *values, n_base, n_cand))
    if config.slo:
        result.comparisons += goodput_comparisons(baseline, candidate, labels, [None, *classes], config, rng,
                                                  unwidened)
    tested = [c for c in result.comparisons if not c.note]
    for comp, adjusted in zip(tested, holm([c.p_value for c in tested]), strict=True):
        comp.p_adjusted = adjusted
        significant = adjusted <= config.alpha
        worse, limit = _regression(comp, config)
        comp.failed = significant and worse > limit
        if significant and not comp.failed and worse > 0:
            comp.note = "significant but within the threshold"
    result.comparisons += saturation_comparisons(baseline, candidate)
    result.notes = _notes(result, baseline, candidate, unwidened)
    return result


def goodput_comparisons(
    baseline: RunData,
    candidate: RunData,
    labels: list[str],
    classes: list[str | None],
    config: GateConfig,
    rng: np.random.Generator,
    unwidened: list[str],
) -> list[Comparison]:
    """The `request_goodput` rows under `config.slo`, per point and class (None: every request), bootstrapped as
    the latency rows are (reports/gate_goodput.py); a class with no request in either run at a point gets none.
    Appends the rows of a side measured once without a noise floor to `unwidened`."""
    out = []
    for label in labels:
        base_groups = goodput_groups(baseline, label, config.slo or {}, classes)
        cand_groups = goodput_groups(candidate, label, config.slo or {}, classes)
        for request_class in classes:
            base, cand = base_groups[request_class], cand_groups[request_class]
            if not base or not cand:
                continue
            metric = goodput_metric(request_class)
            floor = config.noise_floor if 1 in (len(base), len(cand)) else None
            if floor is None and 1 in (len(base), len(cand)):
                unwidened.append(f"{label} {metric}")
            values = compare_groups(base, cand, "mean", config, rng, floor, higher_is_better=True)
            n_base, n_cand = sum(g.size for g in base), sum(g.size for g in cand)
            out.append(Comparison(label, metric, *values, n_baseline=n_base, n_candidate=n_cand, noise_floor=floor))
    return out


def _regression(comp: Comparison, config: GateConfig) -> tuple[float, float]:
    """(how much worse the candidate is, the most the row allows): attainment and goodput regress by dropping."""
    if is_attainment(comp.metric):
        return -comp.change, config.max_attainment_drop
    if is_goodput(comp.metric):
        return -comp.change, config.max_goodput_drop
    if comp.metric == FAILURE_RATE:
        return comp.change, config.max_failure_increase
    return comp.change, config.max_regression


def _speed(run: RunData) -> dict | None:
    return (run.config.get("calibration") or {}).get("speed")


def _notes(result: GateResult, baseline: RunData, candidate: RunData, unwidened: list[str]) -> list[str]:
    notes = []
    base_repeats, cand_repeats = result.repeats
    if min(result.repeats) == 1:
        floors = sorted({c.noise_floor for c in result.comparisons if c.noise_floor})
        side = "both runs" if base_repeats == cand_repeats == 1 else "baseline" if base_repeats == 1 else "candidate"
        if floors:
            notes.append(
                f"{side} measured once: between-run noise enters only as a noise floor "
                f"({', '.join(f'{f:.1%}' for f in floors)} relative SD); sweep with --repeats 3 or more to measure it"
            )
        if unwidened:
            notes.append(
                f"{side} measured once and no noise floor for {', '.join(unwidened)}: the interval holds only "
                "request-to-request noise, and identical code can fail; pass --noise-floor (docs/GATE.md) or "
                "sweep with --repeats"
            )
    threshold = result.config.max_regression
    for key, gap in calibration_gap(_speed(baseline), _speed(candidate)).items():
        if abs(gap) > threshold:
            notes.append(
                f"the two runs' machines differ in speed: calibration {key} changed by {gap:+.1%} (more than the "
                f"{threshold:.0%} threshold); a verdict between different machine states is unreliable"
            )
    return notes
