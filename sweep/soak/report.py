"""`bench soak`'s windows, verdict and report page (plain HTML, no plotting dependencies).

Windows split the load's duration into equal spans by request start time. Drift compares the last window with
the first: latency by the ratio of medians, memory by the last sample in each window. The verdict fails on any
unexpected outcome beyond the bound, drift beyond its bound, or KV usage / running requests not back to 0.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sweep.run.results import write_atomic

EXPECTED_OUTCOMES = ("ok", "cancelled", "disconnected", "expected_4xx")
UNEXPECTED_OUTCOMES = ("http_5xx", "bad_4xx", "accepted_malformed", "wrong_output", "reset", "timeout")


@dataclass
class SoakBounds:
    max_unexpected_errors: int = 0
    max_latency_drift: float = 0.5  # last window's median TTFT/TPOT at most (1 + this) x the first window's
    max_memory_growth: float = 0.05  # resident memory, last window vs first
    drain_timeout_s: float = 30.0  # how long KV usage and running requests get to return to 0 after the load

    def __post_init__(self) -> None:
        if self.max_unexpected_errors < 0:
            raise ValueError("--max-unexpected-errors must be >= 0")
        if self.max_latency_drift < 0 or self.max_memory_growth < 0:
            raise ValueError("--max-latency-drift and --max-memory-growth must be >= 0")
        if self.drain_timeout_s < 0:
            raise ValueError("--drain-timeout must be >= 0")


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default), q in [0, 100]; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _window_of(time_s: float, load_end: float, num_windows: int) -> int:
    if load_end <= 0:
        return 0
    return min(num_windows - 1, max(0, int(time_s / load_end * num_windows)))


def summarize(rows: list[dict[str, Any]], samples: list[dict[str, Any]], final: dict[str, Any] | None,
              load_end: float, num_windows: int, bounds: SoakBounds) -> dict[str, Any]:  # fmt: skip
    """Per-window outcome counts, latency percentiles and metric samples, then the verdict."""
    windows: list[dict[str, Any]] = []
    for index in range(num_windows):
        mine = [r for r in rows if _window_of(r["start"], load_end, num_windows) == index]
        in_window = [s for s in samples if _window_of(s["time"], load_end, num_windows) == index and "error" not in s]
        outcomes: dict[str, int] = {}
        for row in mine:
            outcomes[row["outcome"]] = outcomes.get(row["outcome"], 0) + 1
        ttft = [r["ttft"] for r in mine if r["outcome"] == "ok" and r.get("ttft") is not None]
        tpot = [r["tpot"] for r in mine if r["outcome"] == "ok" and r.get("tpot") is not None]
        latency = [r["latency"] for r in mine if r["kind"] == "valid" and r["outcome"] == "ok"]
        window: dict[str, Any] = {
            "index": index, "start": load_end * index / num_windows, "end": load_end * (index + 1) / num_windows,
            "requests": len(mine), "outcomes": outcomes,
            "unexpected": sum(n for o, n in outcomes.items() if o in UNEXPECTED_OUTCOMES),
        }  # fmt: skip
        for name, values in (("ttft", ttft), ("tpot", tpot), ("latency", latency)):
            for q in (50, 90, 99):
                window[f"{name}_p{q}"] = percentile(values, q)
        last = in_window[-1] if in_window else {}
        for key in ("resident_memory_bytes", "kv_cache_usage", "num_requests_running", "num_requests_waiting"):
            window[key] = last.get(key)
        window["max_kv_cache_usage"] = max((s.get("kv_cache_usage", 0.0) for s in in_window), default=None)
        windows.append(window)
    return {"num_requests": len(rows), "load_seconds": load_end, "windows": windows,
            "errors": _error_examples(rows), "after_load": final,
            "verdict": verdict(rows, windows, final, bounds)}  # fmt: skip


def _error_examples(rows: list[dict[str, Any]], per_class: int = 5) -> dict[str, list[dict[str, Any]]]:
    examples: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        if row["outcome"] in UNEXPECTED_OUTCOMES and len(examples.setdefault(row["outcome"], [])) < per_class:
            examples[row["outcome"]].append(row)
    return examples


def _drift(first: float | None, last: float | None) -> float | None:
    if first is None or last is None or first <= 0:
        return None
    return last / first - 1.0


def verdict(rows: list[dict[str, Any]], windows: list[dict[str, Any]], final: dict[str, Any] | None,
            bounds: SoakBounds) -> dict[str, Any]:  # fmt: skip
    """Each check: its value, its bound, whether it passed (None: not measurable here, which does not fail)."""
    first, last = windows[0], windows[-1]
    unexpected = sum(r["outcome"] in UNEXPECTED_OUTCOMES for r in rows)
    checks: dict[str, dict[str, Any]] = {
        "unexpected_errors": {"value": unexpected, "bound": bounds.max_unexpected_errors,
                              "passed": unexpected <= bounds.max_unexpected_errors},  # fmt: skip
    }
    for name in ("ttft", "tpot"):
        drift = _drift(first[f"{name}_p50"], last[f"{name}_p50"])
        checks[f"{name}_drift"] = {"value": drift, "bound": bounds.max_latency_drift,
                                   "passed": None if drift is None else drift <= bounds.max_latency_drift}  # fmt: skip
    growth = _drift(first["resident_memory_bytes"], last["resident_memory_bytes"])
    checks["memory_growth"] = {"value": growth, "bound": bounds.max_memory_growth,
                               "passed": None if growth is None else growth <= bounds.max_memory_growth}  # fmt: skip
    if final is None or "kv_cache_usage" not in final:
        checks["kv_freed"] = {"value": None, "bound": 0.0, "passed": None}
    else:
        leftover = final.get("kv_cache_usage", 0.0) + final.get("num_requests_running", 0.0)
        checks["kv_freed"] = {"value": {"kv_cache_usage": final.get("kv_cache_usage"),
                                        "num_requests_running": final.get("num_requests_running")},
                              "bound": 0.0, "passed": leftover == 0.0}  # fmt: skip
    passed = bool(rows) and all(c["passed"] is not False for c in checks.values())
    return {"passed": passed, "checks": checks}


def _fmt(value: Any, scale: float = 1.0, digits: int = 1) -> str:
    if value is None:
        return "–"
    if isinstance(value, (int, float)):
        return f"{value * scale:.{digits}f}"
    return html.escape(json.dumps(value))


def write_report(summary: dict[str, Any], path: Path) -> None:
    """A self-contained report page: the verdict, one row per window, examples of each unexpected error."""
    verdict_ = summary["verdict"]
    check_rows = "".join(
        f"<tr class={'pass' if c['passed'] else 'fail' if c['passed'] is False else 'na'}><td>{html.escape(name)}"
        f"</td><td>{_fmt(c['value'], digits=4)}</td><td>{_fmt(c['bound'], digits=4)}</td>"
        f"<td>{ {True: 'pass', False: 'FAIL', None: 'not measured'}[c['passed']]}</td></tr>"
        for name, c in verdict_["checks"].items()
    )
    head = ("<tr><th>window</th><th>seconds</th><th>requests</th><th>unexpected</th><th>outcomes</th>"
            "<th>TTFT p50/p99 ms</th><th>TPOT p50/p99 ms</th><th>latency p50 ms</th><th>RSS MB</th>"
            "<th>KV usage (max)</th><th>running</th><th>waiting</th></tr>")  # fmt: skip
    body = "".join(
        f"<tr><td>{w['index']}</td><td>{w['start']:.0f}–{w['end']:.0f}</td><td>{w['requests']}</td>"
        f"<td>{w['unexpected']}</td><td>{html.escape(json.dumps(w['outcomes'], sort_keys=True))}</td>"
        f"<td>{_fmt(w['ttft_p50'], 1e3)} / {_fmt(w['ttft_p99'], 1e3)}</td>"
        f"<td>{_fmt(w['tpot_p50'], 1e3)} / {_fmt(w['tpot_p99'], 1e3)}</td><td>{_fmt(w['latency_p50'], 1e3)}</td>"
        f"<td>{_fmt(w['resident_memory_bytes'], 1e-6)}</td><td>{_fmt(w['kv_cache_usage'], digits=3)} "
        f"({_fmt(w['max_kv_cache_usage'], digits=3)})</td><td>{_fmt(w['num_requests_running'], digits=0)}</td>"
        f"<td>{_fmt(w['num_requests_waiting'], digits=0)}</td></tr>"
        for w in summary["windows"]
    )
    errors = "".join(
        f"<h3>{html.escape(kind)}</h3><pre>{html.escape(json.dumps(rows, indent=1))}</pre>"
        for kind, rows in summary["errors"].items()
    )
    status = "PASS" if verdict_["passed"] else "FAIL"
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>bench soak: {status}</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;
padding:3px 8px;text-align:right}}tr.fail{{background:#fdd}}tr.pass{{background:#dfd}}tr.na{{background:#eee}}
pre{{background:#f4f4f4;padding:6px;max-height:20em;overflow:auto}}</style></head><body>
<h1>bench soak: {status}</h1>
<p>{summary['num_requests']} requests over {summary['load_seconds']:.0f} s.</p>
<h2>Verdict</h2><table><tr><th>check</th><th>value</th><th>bound</th><th>result</th></tr>{check_rows}</table>
<h2>Windows</h2><table>{head}{body}</table>
<h2>Unexpected errors (first examples)</h2>{errors or "<p>none</p>"}
<h2>After the load</h2><pre>{html.escape(json.dumps(summary.get('after_load'), indent=1))}</pre>
</body></html>"""
    write_atomic(path, page)
