"""The shipped real mixes in workloads/data: read, list and turn into RequestSpecs."""

from __future__ import annotations

import gzip
import json
from functools import lru_cache
from pathlib import Path

import numpy as np

from workloads.spec import RequestSpec, WorkloadInfo

DATA_DIR = Path(__file__).parent / "data"
SUFFIX = ".json.gz"


def shipped_names() -> list[str]:
    return sorted(path.name[: -len(SUFFIX)] for path in DATA_DIR.glob(f"*{SUFFIX}"))


@lru_cache(maxsize=32)
def read_document(name: str) -> dict:
    """The whole shipped document (metadata and columns) for a mix name."""
    path = DATA_DIR / f"{name}{SUFFIX}"
    if not path.is_file():
        raise KeyError(f"no shipped workload {name!r}; shipped: {', '.join(shipped_names())}")
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return json.load(handle)


def metadata(name: str) -> dict:
    """Everything but the per-request columns."""
    return {key: value for key, value in read_document(name).items() if key != "columns"}


def _expand_runs(runs: list[int]) -> list[int]:
    return [start + offset for start, length in zip(runs[::2], runs[1::2], strict=True) for offset in range(length)]


def is_quantile_table(name: str) -> bool:
    return "input_len_quantiles" in read_document(name)["columns"]


def sample_quantile_table(name: str, num_requests: int | None, seed: int) -> list[RequestSpec]:
    """Marginal quantile-table mixes (ServeGen). num_requests=None: the table itself, one request per level
    k/1000 with outputs in a fixed shuffled order (exact marginals at the table's resolution); otherwise
    independent inverse-CDF draws of input and output (seeded)."""
    columns = read_document(name)["columns"]
    inputs, outputs = np.array(columns["input_len_quantiles"]), np.array(columns["output_len_quantiles"])
    levels = len(inputs) - 1
    if num_requests is None:
        order = np.random.default_rng(0).permutation(levels) + 1
        return [RequestSpec(int(i), int(o)) for i, o in zip(inputs[1:], outputs[order], strict=True)]
    rng = np.random.default_rng(seed)
    draw_in, draw_out = np.ceil(rng.random((2, num_requests)) * levels).astype(int).clip(1, levels)
    return [RequestSpec(int(i), int(o)) for i, o in zip(inputs[draw_in], outputs[draw_out], strict=True)]


def load_mix(name: str) -> list[RequestSpec]:
    """All requests of a shipped mix in trace order, with the source's own token counts."""
    if is_quantile_table(name):
        return sample_quantile_table(name, None, 0)
    document = read_document(name)
    columns = document["columns"]
    inputs, outputs = columns["input_len"], columns["output_len"]
    timestamps: list[float | None] = [None] * len(inputs)
    if "timestamp_delta_us" in columns:
        total = 0
        for index, delta in enumerate(columns["timestamp_delta_us"]):
            total += delta
            timestamps[index] = total / 1e6
    prefix_ids: list[list[int] | None] = [None] * len(inputs)
    block_size = None
    if "hash_id_runs" in columns:
        prefix_ids = [_expand_runs(runs) for runs in columns["hash_id_runs"]]
        block_size = document["prefix"]["block_size_tokens"]
    return [
        RequestSpec(
            input_len=input_len,
            output_len=output_len,
            timestamp=timestamp,
            prefix_ids=ids,
            prefix_block_size=block_size if ids is not None else None,
        )
        for input_len, output_len, timestamp, ids in zip(inputs, outputs, timestamps, prefix_ids, strict=True)
    ]


def info(name: str) -> WorkloadInfo:
    meta = metadata(name)
    inputs, outputs = meta["source_percentiles"]["input_len"], meta["source_percentiles"]["output_len"]
    return WorkloadInfo(
        name=name,
        source=meta["source_label"],
        licence=meta["licence"],
        count=meta["rows"],
        input_p50=inputs["p50"],
        input_p90=inputs["p90"],
        output_p50=outputs["p50"],
        output_p90=outputs["p90"],
        has_timestamps="n_requests" in (meta["arrivals"] or {}),
        has_prefix_ids=meta["prefix"] is not None,
        description=meta["description"],
    )


def list_workloads() -> list[WorkloadInfo]:
    return [info(name) for name in shipped_names()]
