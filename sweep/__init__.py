"""servelab's load generator: an async OpenAI client, vLLM-identical metrics, sweeps and SLO search.

    import sweep
    results = sweep.load_results("results/sweep")     # .points, .requests (DataFrames), .config
    sweep.run_sweep(sweep.SweepConfig(output_dir=..., values=[1, 2, 4], url="http://host:8000/v1", model=...))

Light to import: the heavy parts load on first use.
"""

from __future__ import annotations

from typing import Any

from sweep.run.results import Results, load_results

__all__ = [
    "Results",
    "SweepConfig",
    "Sweeper",
    "calculate_metrics",
    "load_results",
    "run_sweep",
]


def __getattr__(name: str) -> Any:
    if name in ("SweepConfig", "Sweeper", "run_sweep"):
        from sweep.run import sweeper

        return getattr(sweeper, name)
    if name == "calculate_metrics":
        from sweep.point.benchmark_metrics import calculate_metrics

        return calculate_metrics
    raise AttributeError(f"module 'sweep' has no attribute {name!r}")
