"""Load a run for reports and the gate: a `bench sweep` run directory, a vLLM `bench serve` result
JSON (with `--save-detailed`), a directory of such JSONs, or a GuideLLM JSON report.

Everything becomes a `RunData`: `points` (one row per sweep point, vLLM result field names) and
`requests` (one row per request, the sweep's requests.jsonl fields), the same schema as
`sweep.load_results`, so reports and the gate work across tools.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from reports import vllm_results
from reports.recompute import DEFAULT_PERCENTILES, normalize_slo, point_metrics


class RunInputError(ValueError):
    """A run that cannot be read: missing files, unknown format, inconsistent contents."""


@dataclass
class RunData:
    name: str
    points: pd.DataFrame
    requests: pd.DataFrame
    config: dict[str, Any] = field(default_factory=dict)
    source: str = "servelab"  # servelab | vllm | guidellm
    skipped: list[dict[str, Any]] = field(default_factory=list)  # skipped.json: loads above a saturated one

    @property
    def mode(self) -> str:
        """'concurrency' or 'rate': the load axis of the sweep."""
        mode = (self.config.get("sweep") or {}).get("mode")
        if mode in ("concurrency", "rate"):
            return mode
        mc = self.points.get("max_concurrency")
        return "concurrency" if mc is not None and mc.notna().all() else "rate"

    @property
    def percentiles(self) -> tuple[float, ...]:
        return tuple(self.config.get("percentiles") or DEFAULT_PERCENTILES)

    @property
    def slo(self) -> dict[str, float] | None:
        return normalize_slo(self.config.get("slo"))

    def load_values(self) -> pd.Series:
        """The load of each point (concurrency or offered rate; inf as np.inf)."""
        column = "max_concurrency" if self.mode == "concurrency" else "request_rate"
        return pd.to_numeric(self.points[column].replace({"inf": np.inf}), errors="coerce")

    def point_requests(self, label: str) -> pd.DataFrame:
        return self.requests[self.requests["label"] == label]


def point_label(max_concurrency: int | None, request_rate: float | str | None) -> str:
    """The sweep's point label: `c0016` for concurrency 16, `r0002.00` for rate 2.0, `rinf`."""
    from sweep.run.results import concurrency_label, rate_label

    if max_concurrency is not None:
        return concurrency_label(int(max_concurrency))
    return rate_label(float(request_rate) if request_rate not in (None, "inf") else math.inf)


def load_run(path: str | Path, name: str | None = None) -> RunData:
    """Read any supported result into a RunData (raises RunInputError with a clear message)."""
    path = Path(path)
    if not path.exists():
        raise RunInputError(f"{path}: no such file or directory")
    if path.is_dir():
        if (path / "config.json").exists():
            run = _load_servelab_run(path)
        else:
            files = sorted(p for p in path.glob("*.json") if not p.name.endswith(".pytorch.json"))
            if not files:
                raise RunInputError(f"{path}: neither a sweep run directory (config.json) nor a folder of result JSONs")
            run = _merge([_load_file(f) for f in files], path.name)
    else:
        run = _load_file(path)
    if name:
        run.name = name
    return run


def load_runs(paths: list[str | Path]) -> list[RunData]:
    """Load several runs, making their names unique (they label overlays and the `run` column)."""
    runs = [load_run(p) for p in paths]
    seen: dict[str, int] = {}
    for run, path in zip(runs, paths, strict=True):
        if run.name in seen:
            run.name = f"{Path(path).resolve().parent.name}/{run.name}"
        while run.name in seen:
            run.name += "'"
        seen[run.name] = 1
        run.points["run"] = run.name
        run.requests["run"] = run.name
    return runs


# --- servelab run directories -------------------------------------------------------------------


def _load_servelab_run(run_dir: Path) -> RunData:
    from sweep.run.results import SKIPPED, load_results

    try:
        results = load_results(run_dir)
    except (OSError, ValueError, KeyError) as exc:  # JSONDecodeError is a ValueError
        raise RunInputError(f"{run_dir}: unreadable run directory ({exc})") from None
    points, requests = results.points.copy(), results.requests.copy()
    if points.empty:
        raise RunInputError(f"{run_dir}: the run has no finished points (points/*.json)")
    for column in ("label", "duration"):
        if column not in points:
            raise RunInputError(f"{run_dir}: point files lack the {column!r} field")
    if requests.empty:
        raise RunInputError(f"{run_dir}: requests.jsonl is missing or empty; per-request rows are needed")
    if "in_window" in requests:  # steady-state windows: the points' figures are the windows', so are the rows
        requests = requests[~requests["in_window"].astype(object).eq(False)].reset_index(drop=True)
    name = run_dir.resolve().name
    points["run"] = name
    requests["run"] = name
    run = RunData(name=name, points=points, requests=requests, config=dict(results.config), source="servelab")
    if (run_dir / SKIPPED).exists():
        run.skipped = json.loads((run_dir / SKIPPED).read_text())
    order = np.argsort(run.load_values().to_numpy(), kind="stable")
    run.points = points.iloc[order].reset_index(drop=True)
    return run


def _merge(runs: list[RunData], name: str) -> RunData:
    points = pd.concat([r.points for r in runs], ignore_index=True)
    if points["label"].duplicated().any():
        dup = sorted(points.loc[points["label"].duplicated(), "label"])
        raise RunInputError(f"{name}: several result files describe the same point(s) {dup}")
    requests = pd.concat([r.requests for r in runs], ignore_index=True)
    run = RunData(name=name, points=points, requests=requests, config=runs[0].config, source=runs[0].source,
                  skipped=[entry for r in runs for entry in r.skipped])
    order = np.argsort(run.load_values().to_numpy(), kind="stable")
    run.points = points.iloc[order].reset_index(drop=True)
    run.points["run"] = name
    run.requests["run"] = name
    return run


def _load_file(path: Path) -> RunData:
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise RunInputError(f"{path}: not valid JSON ({exc})") from None
    except UnicodeDecodeError:
        raise RunInputError(f"{path}: not a text file (a vLLM result or GuideLLM report is JSON)") from None
    except OSError as exc:
        raise RunInputError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if isinstance(data, dict) and isinstance(data.get("benchmarks"), list):
        return import_guidellm(data, path)
    if isinstance(data, dict) and "ttfts" in data:
        return import_vllm(data, path)
    raise RunInputError(f"{path}: {vllm_results.what_else(data)}")


# --- vLLM `bench serve --save-result --save-detailed` -----------------------------------------------


def import_vllm(data: dict[str, Any], path: Path) -> RunData:
    """One vLLM result JSON = one point; each field is read or ignored as reports/vllm_results.py lists it."""
    try:
        success = vllm_results.check_result(data)
    except ValueError as exc:
        raise RunInputError(f"{path}: not a usable `vllm bench serve --save-detailed` result: {exc}") from None
    n = len(data["ttfts"])
    latencies = data.get("latencies") or [None] * n
    starts = data.get("start_times") or [None] * n
    queues = data.get("queue_times") or [None] * n
    rate = data.get("request_rate", "inf")
    open_loop = rate not in (None, "inf") and math.isfinite(float(rate))
    # a finite rate is a rate point even with a --max-concurrency cap; rate=inf with a cap is a closed loop
    label = point_label(None if open_loop else data.get("max_concurrency"), rate)
    rows = []
    for i in range(n):
        ok = success[i]
        ttft, itl = data["ttfts"][i], list(data["itls"][i] or [])
        start = starts[i] if starts[i] is not None else 0.0  # without start_times: request-relative times
        e2el = latencies[i] if latencies[i] is not None else ttft + sum(itl)
        rows.append(
            {
                "label": label,
                "index": i,
                "success": ok,
                "error": None if ok else (data["errors"][i] or "failed (vLLM recorded no error text)"),
                "intended_send_time": start - queues[i] if queues[i] is not None else start,
                "send_time": start,
                "first_token_time": start + ttft if ok else None,
                "last_token_time": start + e2el if ok else None,
                "end_time": start + e2el,
                "ttft": ttft if ok else None,
                "e2el": e2el if ok else None,
                "itl": itl,
                "chunk_times": list(start + ttft + np.cumsum([0.0, *itl])) if ok else [],
                "chunk_tokens": [],
                "prompt_tokens": data["input_lens"][i],
                "output_tokens": data["output_lens"][i],
                "client_prompt_tokens": None,
                "client_output_tokens": None,
                "requested_input_len": None,
                "requested_output_len": None,
                "server_timing": None,
            }
        )
    requests = pd.DataFrame(rows)
    percentiles = _vllm_percentiles(data)
    point = vllm_results.point_fields(data)
    point.update(label=label, max_concurrency=data.get("max_concurrency"), request_rate=data.get("request_rate", "inf"))
    recomputed = point_metrics(
        requests, float(data["duration"]), percentiles, None, data.get("max_concurrency"), data.get("request_rate")
    )
    for key, value in recomputed.items():
        point.setdefault(key, value)  # keep vLLM's own figures; fill what it did not print (e.g. E2EL)
    config = {
        "run_id": path.stem,
        "created": data.get("date"),
        "label": data.get("label"),
        "target": {
            "model": data.get("model_id"),
            "backend": data.get("backend"),
            "endpoint_type": data.get("endpoint_type"),
            "engine_knobs": {},
        },
        "workload": {"tokenizer_id": data.get("tokenizer_id"), "num_prompts": data.get("num_prompts")},
        "sweep": {"mode": "rate" if open_loop or data.get("max_concurrency") is None else "concurrency"},
        "slo": None,
        "percentiles": list(percentiles),
        "command": "vllm bench serve",
        "ignored_fields": vllm_results.ignored_fields(data),
    }
    return RunData(name=path.stem, points=pd.DataFrame([point]), requests=requests, config=config, source="vllm")


def _vllm_percentiles(data: dict[str, Any]) -> tuple[float, ...]:
    found = set()
    for key in data:
        if key.startswith("p") and key.endswith("_ttft_ms"):
            try:
                found.add(float(key[1:].split("_", 1)[0]))
            except ValueError:
                pass
    return tuple(sorted(found | set(DEFAULT_PERCENTILES)))


# --- GuideLLM JSON reports (`guidellm benchmark ... --outputs json`) ------------------------------------


def import_guidellm(data: dict[str, Any], path: Path) -> RunData:
    """Each GuideLLM benchmark (one strategy) = one point; successful and errored requests are kept,
    incomplete ones (cut off by the benchmark's end) are counted in the point's `incomplete` field.
    GuideLLM stores no chunk gaps, so ITL fields are NaN; TPOT/TTFT/E2EL use vLLM's definitions."""
    points, frames = [], []
    for position, bench in enumerate(data["benchmarks"]):
        strategy = (bench.get("config") or {}).get("strategy") or (bench.get("args") or {}).get("strategy") or {}
        kind = strategy.get("type_", "")
        concurrency = {"concurrent": strategy.get("streams"), "synchronous": 1}.get(kind)
        rate = strategy.get("rate") if kind in ("constant", "poisson") else "inf"
        if concurrency is None and rate == "inf" and kind != "throughput":
            raise RunInputError(f"{path}: benchmark {position} has an unknown strategy {kind!r}")
        label = point_label(concurrency, rate)
        groups = bench.get("requests") or {}
        rows = [_guidellm_row(r, True, label) for r in groups.get("successful") or []]
        rows += [_guidellm_row(r, False, label) for r in groups.get("errored") or []]
        requests = pd.DataFrame(rows)
        if requests.empty:
            raise RunInputError(f"{path}: benchmark {position} ({label}) has no per-request data")
        requests["index"] = range(len(requests))
        duration = bench.get("duration")
        if duration is None and bench.get("end_time") is not None:
            duration = bench["end_time"] - bench["start_time"]
        if duration is None:
            duration = float(requests["end_time"].max() - requests["send_time"].min())
        point = point_metrics(requests, float(duration), DEFAULT_PERCENTILES, None, concurrency, rate)
        for key in [k for k in point if k.endswith("_itl_ms")]:
            point[key] = float("nan")
        point.update(
            label=label,
            max_concurrency=concurrency,
            request_rate=rate,
            burstiness=1.0 if kind == "poisson" else None,
            incomplete=len(groups.get("incomplete") or []),
            guidellm_strategy=kind,
        )
        points.append(point)
        frames.append(requests)
    if len({p["label"] for p in points}) != len(points):
        raise RunInputError(f"{path}: several GuideLLM benchmarks map to the same point label")
    modes = {"concurrency" if p["max_concurrency"] is not None else "rate" for p in points}
    config = {
        "run_id": path.stem,
        "target": {"model": _dig(data, "args", "model"), "url": _dig(data, "args", "target"), "engine_knobs": {}},
        "workload": {"data": _dig(data, "args", "data")},
        "sweep": {"mode": modes.pop() if len(modes) == 1 else "rate"},
        "slo": None,
        "percentiles": list(DEFAULT_PERCENTILES),
        "command": "guidellm benchmark",
    }
    run = RunData(path.stem, pd.DataFrame(points), pd.concat(frames, ignore_index=True), config, "guidellm")
    order = np.argsort(run.load_values().to_numpy(), kind="stable")
    run.points = run.points.iloc[order].reset_index(drop=True)
    return run


def _dig(data: dict, *keys: str) -> Any:
    for key in keys:
        data = data.get(key) if isinstance(data, dict) else None
    return data


def _guidellm_row(req: dict[str, Any], ok: bool, label: str) -> dict[str, Any]:
    info = req.get("info") or {}
    timings = info.get("timings") or {}
    start = timings.get("request_start", req.get("start_time"))
    first = timings.get("first_token_iteration", req.get("first_token_time"))
    last = timings.get("last_token_iteration", req.get("last_token_time"))
    end = timings.get("request_end", req.get("end_time"))
    ok = ok and start is not None and first is not None
    finish = last if last is not None else end  # vLLM's E2EL ends at the last token chunk
    return {
        "label": label,
        "success": ok,
        "error": None if ok else (info.get("error") or req.get("error") or "errored"),
        "intended_send_time": timings.get("targeted_start", start),
        "send_time": start,
        "first_token_time": first,
        "last_token_time": last,
        "end_time": end,
        "ttft": first - start if ok else None,
        "e2el": finish - start if ok and finish is not None else None,
        "itl": [],
        "chunk_times": [],
        "chunk_tokens": [],
        "prompt_tokens": req.get("prompt_tokens"),
        "output_tokens": req.get("output_tokens") if ok else 0,
        "client_prompt_tokens": None,
        "client_output_tokens": None,
        "requested_input_len": None,
        "requested_output_len": None,
        "server_timing": None,
    }
