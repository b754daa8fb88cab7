"""The run directory (see the results contract): written point by point, atomically, resumable.

A point is finished exactly when `points/<label>.json` exists. Its request rows are appended to
`requests.jsonl` (and fsync'd) *before* that file is published, so a crash leaves either a finished point
with all its rows, or stray rows of an unfinished point, which `open_run(..., resume=True)` drops.

Additions to the contract: `search.json` (the `--max-load-under-slo` bracket and probes), `skipped.json` (with
`--stop-when-saturated`: the loads not measured because a lower one saturated; label, request_rate, reason),
`server.log` (the built-in engine's log when the sweep launched it), and with `--repeats R`
`repeats/<label>.r<k>.json`: one file per finished repeat of a point, published after that repeat's rows
(which carry `"repeat": k`); `points/<label>.json` follows once all R repeats are in, over their pooled rows.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

CONFIG = "config.json"
POINTS = "points"
REQUESTS = "requests.jsonl"
SUMMARY = "summary.csv"
SEARCH = "search.json"
SKIPPED = "skipped.json"
SERVER_LOG = "server.log"
REPEATS = "repeats"


class ReportRenderer(Protocol):
    """Renders run directories into `out_dir` and returns report.html's path (`reports.render_report`).

    The sweep never imports `reports`: cli.py hands one to `register` of `bench sweep` and `bench tune`.
    """

    def __call__(self, run_dirs: list[Path], out_dir: Path, slo: Mapping[str, float] | None = None) -> Path: ...


def concurrency_label(concurrency: int) -> str:
    return f"c{concurrency:04d}"


def rate_label(rate: float) -> str:
    return "rinf" if math.isinf(rate) else f"r{rate:07.2f}"


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def _dumps(value: Any, indent: int | None = 2) -> str:
    def clean(v: Any) -> Any:
        if isinstance(v, float) and not math.isfinite(v):
            return "inf" if v > 0 else None  # vLLM writes request_rate "inf"
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [clean(x) for x in v]
        return v

    return json.dumps(clean(value), indent=indent, default=_json_default)


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class RunWriter:
    """Writes one run directory. Use `open_run` to create or resume one."""

    def __init__(self, run_dir: Path, config: dict[str, Any]) -> None:
        self.run_dir = run_dir
        self.config = config
        (run_dir / POINTS).mkdir(parents=True, exist_ok=True)

    def save_config(self) -> None:
        write_atomic(self.run_dir / CONFIG, _dumps(self.config))

    def finished_labels(self) -> set[str]:
        return {p.stem for p in (self.run_dir / POINTS).glob("*.json")}

    def load_point(self, label: str) -> dict[str, Any]:
        return json.loads((self.run_dir / POINTS / f"{label}.json").read_text())

    def write_point(self, point: dict[str, Any], request_rows: list[dict[str, Any]]) -> None:
        label = point["label"]
        self._append_rows(request_rows)
        write_atomic(self.run_dir / POINTS / f"{label}.json", _dumps(point))
        self._write_summary()

    def _append_rows(self, request_rows: list[dict[str, Any]]) -> None:
        # One write() call: a process killed mid-append leaves whole lines (only a power loss can tear one).
        data = "".join(_dumps(row, indent=None) + "\n" for row in request_rows).encode()
        fd = os.open(self.run_dir / REQUESTS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)

    def finished_repeats(self) -> set[tuple[str, int]]:
        """(label, repeat) of every published repeat (`--repeats`)."""
        return {(p.stem.rsplit(".r", 1)[0], int(p.stem.rsplit(".r", 1)[1])) for p in self._repeat_files()}

    def _repeat_files(self) -> list[Path]:
        return sorted((self.run_dir / REPEATS).glob("*.r*.json"))

    def load_repeat(self, label: str, repeat: int) -> dict[str, Any]:
        return json.loads((self.run_dir / REPEATS / f"{label}.r{repeat}.json").read_text())

    def write_repeat(self, point: dict[str, Any], repeat: int, request_rows: list[dict[str, Any]]) -> None:
        """Publish one repeat of a point: its rows (tagged with the repeat) first, then its point file."""
        self._append_rows([{**row, "repeat": repeat} for row in request_rows])
        (self.run_dir / REPEATS).mkdir(exist_ok=True)
        write_atomic(self.run_dir / REPEATS / f"{point['label']}.r{repeat}.json", _dumps(point))

    def load_rows(self, label: str) -> list[dict[str, Any]]:
        """The stored request rows of one point (all its repeats)."""
        rows = [json.loads(line) for line in (self.run_dir / REQUESTS).read_text().splitlines() if line.strip()]
        return [row for row in rows if row.get("label") == label]

    def write_search(self, search: dict[str, Any]) -> None:
        write_atomic(self.run_dir / SEARCH, _dumps(search))

    def write_skipped(self, skipped: list[dict[str, Any]]) -> None:
        """The loads a sweep skipped (`SKIPPED`); an empty list removes a stale file (a resumed run)."""
        path = self.run_dir / SKIPPED
        if skipped:
            write_atomic(path, _dumps(skipped))
        elif path.exists():
            path.unlink()

    def _write_summary(self) -> None:
        points = [self.load_point(label) for label in sorted(self.finished_labels())]
        points.sort(key=lambda p: (p.get("max_concurrency") or 0, _rate_key(p.get("request_rate"))))
        columns: list[str] = []
        for point in points:
            columns += [k for k, v in point.items() if not isinstance(v, dict | list) and k not in columns]
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(points)
        write_atomic(self.run_dir / SUMMARY, buffer.getvalue())


def _rate_key(rate: Any) -> float:
    return math.inf if rate in (None, "inf") else float(rate)


def _drop_unfinished_rows(run_dir: Path, finished: set[str], finished_repeats: frozenset | set = frozenset()) -> int:
    path = run_dir / REQUESTS
    if not path.exists():
        return 0
    kept, dropped = [], 0
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            label = row["label"]
        except (json.JSONDecodeError, KeyError):
            dropped += 1  # a torn last line from a crash mid-append
            continue
        if label in finished or (label, row.get("repeat")) in finished_repeats:
            kept.append(line)
        else:
            dropped += 1
    if dropped:
        write_atomic(path, "".join(line + "\n" for line in kept))
    return dropped


# Config fields that must match for `--resume` to continue a run rather than mix two different ones.
RESUME_KEYS = ("target", "workload", "slo", "percentiles")


def _comparable(key: str, value: Any) -> Any:
    relaunched = isinstance(value, dict) and (value.get("backend") == "servelab" or value.get("launch_template"))
    if key == "target" and relaunched:
        return {k: v for k, v in value.items() if k != "url"}  # a relaunched server gets a new port
    return value


def open_run(run_dir: str | Path, config: dict[str, Any], resume: bool) -> RunWriter:
    """Create a run directory, or with `resume` continue one whose config matches on RESUME_KEYS.

    A directory holding a config but no finished point (say, the engine failed to start) is started over."""
    run_dir = Path(run_dir)
    config_path = run_dir / CONFIG
    existing = RunWriter(run_dir, config) if config_path.exists() and not resume else None
    if existing is not None and not existing.finished_labels() and not existing.finished_repeats():
        _drop_unfinished_rows(run_dir, set())  # a run that never finished a point (a failed start) starts over
        config_path.unlink()
    if config_path.exists():
        if not resume:
            raise FileExistsError(
                f"{run_dir} already holds a run; pass --resume to continue it or choose another --output-dir"
            )
        previous = json.loads(config_path.read_text())
        fresh = json.loads(_dumps(config))
        changed = [k for k in RESUME_KEYS if _comparable(k, fresh.get(k)) != _comparable(k, previous.get(k))]
        if changed:
            raise ValueError(
                f"cannot resume {run_dir}: {', '.join(changed)} differ from the stored run; "
                "use the original flags or a new --output-dir"
            )
        config = {**previous, "sweep": config.get("sweep", previous.get("sweep"))}
        writer = RunWriter(run_dir, config)
        _drop_unfinished_rows(run_dir, writer.finished_labels(), writer.finished_repeats())
    else:
        run_dir.mkdir(parents=True, exist_ok=True)
        writer = RunWriter(run_dir, config)
    writer.save_config()
    return writer


@dataclass
class Results:
    points: Any  # pandas.DataFrame, one row per point
    requests: Any  # pandas.DataFrame, one row per request
    config: dict[str, Any]


def load_results(run_dir: str | Path) -> Results:
    """Read a run directory back: `.points`, `.requests` (DataFrames with a `run` column) and `.config`."""
    import pandas as pd

    run_dir = Path(run_dir)
    if not (run_dir / CONFIG).exists():
        raise FileNotFoundError(f"{run_dir} is not a sweep run directory (no {CONFIG})")
    config = json.loads((run_dir / CONFIG).read_text())
    point_dicts = [json.loads(p.read_text()) for p in sorted((run_dir / POINTS).glob("*.json"))]
    points = pd.DataFrame(point_dicts)
    rows = []
    if (run_dir / REQUESTS).exists():
        rows = [json.loads(line) for line in (run_dir / REQUESTS).read_text().splitlines() if line.strip()]
    requests = pd.DataFrame(rows)
    points["run"] = run_dir.name
    requests["run"] = run_dir.name
    return Results(points=points, requests=requests, config=config)


def console_header(p: str) -> str:
    """The header of the sweep's console table (`p`: the top percentile's name, e.g. p99)."""
    return (f"[bold]{'point':>9} {'done':>5} {'fail':>4} {'req/s':>7} {'out tok/s':>9} {'TTFT p50':>9} "
            f"{'TTFT ' + p:>9} {'TPOT p50':>9} {'TPOT ' + p:>9} {'E2EL ' + p:>9} {'attain':>6}[/bold]")


def console_row(point: dict[str, Any], p: str) -> str:
    """One point's row of the sweep's console table."""
    attain = point.get("slo_attainment")
    return (f"{point['label']:>9} {point['completed']:>5} {point['failed']:>4} {point['request_throughput']:>7.2f} "
            f"{point['output_throughput']:>9.1f} {point['median_ttft_ms']:>9.1f} {point[f'{p}_ttft_ms']:>9.1f} "
            f"{point['median_tpot_ms']:>9.2f} {point[f'{p}_tpot_ms']:>9.2f} {point[f'{p}_e2el_ms']:>9.1f} "
            f"{'-' if attain is None else f'{attain:.3f}':>6}")
