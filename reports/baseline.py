"""The gate's baseline store: one blessed run (copied whole, with its config) plus a manifest and history.

Layout of a store directory:
    run/            the blessed run (a `bench sweep` run directory, or imported result files)
    baseline.json   manifest: when and from where it was blessed, its run_id, points and full config
    history.jsonl   one manifest line per blessing, oldest first
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from reports.importers import RunData, RunInputError, load_run

RUN_SUBDIR = "run"
MANIFEST = "baseline.json"
HISTORY = "history.jsonl"


def _git_commit() -> str | None:
    if os.environ.get("GITHUB_SHA"):
        return os.environ["GITHUB_SHA"]
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def update_baseline(store: Path, candidate: Path, note: str | None = None) -> dict[str, Any]:
    """Bless `candidate` as the store's baseline; the previous one is replaced only once the copy is complete."""
    store, candidate = Path(store), Path(candidate)
    run = load_run(candidate)  # refuse to bless something the gate could not read
    store.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    incoming = store / f".incoming-{stamp}"
    if candidate.is_dir():
        shutil.copytree(candidate, incoming)
    else:
        incoming.mkdir()
        shutil.copy2(candidate, incoming / candidate.name)
    manifest = {
        "blessed_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "source": str(candidate.resolve()),
        "source_format": run.source,
        "run_id": run.config.get("run_id", run.name),
        "git_commit": _git_commit(),
        "note": note,
        "points": list(run.points["label"]),
        "point_stats": blessed_point_stats(run),
        "config": run.config,
    }
    current = store / RUN_SUBDIR
    retired = store / f".retired-{stamp}"
    if current.exists():
        current.rename(retired)
    incoming.rename(current)
    shutil.rmtree(retired, ignore_errors=True)
    (store / MANIFEST).write_text(json.dumps(manifest, indent=2, default=str) + "\n")
    with (store / HISTORY).open("a") as fh:
        fh.write(json.dumps(manifest, default=str) + "\n")
    return manifest


def blessed_point_stats(run: RunData) -> dict[str, dict[str, float]]:
    """Per point, the latency statistics the gate's history noise floor reads (reports/gate_noise.py)."""
    from reports.gate_noise import point_stats
    from reports.recompute import request_latencies

    out = {}
    for label in run.points["label"]:
        latencies = request_latencies(run.point_requests(label))
        names = ("ttft", "tpot", "e2el", "itl_p99", "max_stall")
        columns = {name: latencies[f"{name}_ms"].to_numpy(dtype=float) for name in names}
        out[label] = point_stats(columns)
    return out


def has_baseline(store: Path) -> bool:
    return (Path(store) / RUN_SUBDIR).exists()


def baseline_run_dir(store: Path) -> Path:
    """The blessed run inside a store (RunInputError when the store holds none)."""
    run_dir = Path(store) / RUN_SUBDIR
    if not has_baseline(store):
        raise RunInputError(
            f"{store}: no blessed baseline; record one with `bench gate --update-baseline --baseline-store {store} "
            "--candidate RUN_DIR`"
        )
    return run_dir


def read_manifest(store: Path) -> dict[str, Any]:
    path = Path(store) / MANIFEST
    if not path.exists():
        raise RunInputError(f"{store}: no {MANIFEST}; is this a baseline store?")
    return json.loads(path.read_text())
