"""Alibaba ServeGen per-client statistics -> a shipped quantile-table mix with a diurnal arrival-rate curve.

ServeGen publishes, per client, one row per 600 s window (rate, inter-arrival CV, Gamma/Weibull fit) and a
length PMF per 6 h snapshot, not per-request rows. The mix is the rate x window weighted mixture of the
clients' PMFs (as ../shared/workloads/tools/summarize_workloads.py computes it), shipped as its inverse CDF at
probability levels k/1000: resolution 0.1 percentage point. Input and output are separate marginals (ServeGen
gives no joint distribution), so they are sampled independently.
"""

from __future__ import annotations

import ast
import bisect
import json
from collections import defaultdict
from pathlib import Path

from workloads.spec import WorkloadFormatError

QUANTILE_LEVELS = 1000  # table[k] = smallest x with CDF(x) >= k/1000; table[0] = min, table[1000] = max


def _window_rows(path: Path) -> list[tuple[int, float, float, str]]:
    rows = []
    for line_number, line in enumerate(path.read_text().splitlines(), start=1):
        parts = line.strip().split(",")
        if len(parts) < 6:
            raise WorkloadFormatError(path, line_number, f"expected 6 columns, got {len(parts)}")
        try:
            rows.append((int(parts[0]), float(parts[1]), float(parts[2]), parts[3]))
        except ValueError:
            raise WorkloadFormatError(path, line_number, f"bad window row {line!r}") from None
    return rows


def _pmf(text: str, path: Path, snapshot: str) -> dict[int, float]:
    try:
        pmf = ast.literal_eval(text) if isinstance(text, str) else text
    except (ValueError, SyntaxError):
        raise WorkloadFormatError(path, None, f"snapshot {snapshot}: PMF is not a Python dict literal") from None
    return {int(x): float(p) for x, p in pmf.items() if p > 0}


def quantile_table(pmf: dict[int, float]) -> list[int]:
    items = sorted(pmf.items())
    total = sum(p for _, p in items)
    values, cumulative, running = [x for x, _ in items], [], 0.0
    for _, p in items:
        running += p / total
        cumulative.append(running)
    table = [values[0]]
    for k in range(1, QUANTILE_LEVELS):
        index = bisect.bisect_left(cumulative, k / QUANTILE_LEVELS - 1e-12)
        table.append(values[min(index, len(values) - 1)])
    return table + [values[-1]]


def pmf_percentiles(pmf: dict[int, float]) -> dict[str, float]:
    """p1..p99 as the discrete inverse CDF (what summary.json reports for ServeGen), min, max, mean."""
    table = quantile_table(pmf)
    total = sum(pmf.values())
    result: dict[str, float] = {f"p{q}": table[q * QUANTILE_LEVELS // 100] for q in (1, 10, 25, 50, 75, 90, 99)}
    result.update(min=table[0], max=table[-1], mean=round(sum(x * p for x, p in pmf.items()) / total, 2))
    return result


def window_length(rows: list, index: int) -> int:
    if index + 1 < len(rows):
        return rows[index + 1][0] - rows[index][0]
    return rows[index][0] - rows[index - 1][0] if index else 600


def derive_servegen(model_dir: Path) -> dict:
    """Columns (quantile tables) and arrival statistics for one ServeGen model directory."""
    traces = {int(p.name.split("-")[1]): _window_rows(p) for p in sorted(model_dir.glob("chunk-*-trace.csv"))}
    if not traces:
        raise WorkloadFormatError(model_dir, None, "no chunk-N-trace.csv files")
    aggregate: dict[int, float] = defaultdict(float)
    cv_weighted = volume_with_pattern = 0.0
    pattern_volume: dict[str, float] = defaultdict(float)
    fields: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    covered = total_volume = 0.0
    for client, rows in traces.items():
        snapshots: dict[int, dict[str, dict[int, float]]] = {}
        dataset = model_dir / f"chunk-{client}-dataset.json"
        if dataset.is_file():
            for ts, record in json.loads(dataset.read_text()).items():
                parsed = {name: _pmf(text, dataset, ts) for name, text in record.items()}
                if all(parsed.values()):
                    snapshots[int(ts)] = parsed
        starts = sorted(snapshots)
        for index, (ts, rate, cv, pattern) in enumerate(rows):
            weight = rate * window_length(rows, index)
            aggregate[ts] += rate
            total_volume += weight
            if rate > 0 and pattern:
                cv_weighted += cv * weight
                volume_with_pattern += weight
                pattern_volume[pattern] += weight
            snapshot_index = bisect.bisect_right(starts, ts) - 1
            if rate <= 0 or snapshot_index < 0:
                continue
            covered += weight
            for name in ("input_tokens", "output_tokens"):
                for x, p in snapshots[starts[snapshot_index]][name].items():
                    fields[name][x] += weight * p
    times = sorted(aggregate)
    rates = [round(aggregate[t], 4) for t in times]
    return {
        "columns": {
            "input_len_quantiles": quantile_table(fields["input_tokens"]),
            "output_len_quantiles": quantile_table(fields["output_tokens"]),
        },
        "source_percentiles": {
            "input_len": pmf_percentiles(fields["input_tokens"]),
            "output_len": pmf_percentiles(fields["output_tokens"]),
        },
        "arrivals": {
            "kind": "aggregate rate per window (ServeGen publishes no per-request timestamps)",
            "window_s": times[1] - times[0],
            "aggregate_rate_rps": rates,
            "mean_rate_rps": round(sum(rates) / len(rates), 4),
            "peak_to_mean": round(max(rates) / (sum(rates) / len(rates)), 3),
            "volume_weighted_mean_client_iat_cv": round(cv_weighted / volume_with_pattern, 4),
            "arrival_pattern_volume_share": {k: round(v / volume_with_pattern, 4) for k, v in pattern_volume.items()},
        },
        "dataset_volume_coverage": round(covered / total_volume, 4),
        "clients": len(traces),
    }
