"""`bench throughput --vary`: one engine per combination of knob values, the same requests, a ratio table.

`--vary KNOB=V1,V2,...` names an engine knob by its config field name (dtype, quantization, kv_cache_dtype,
tensor_parallel_size, max_num_seqs, cpu_threads, ...); several `--vary` make a grid, their product with the
first `--vary` outermost. A value is read as the knob's type (an integer, a number, true/false for an on/off
knob, text otherwise); `default` leaves the knob at the engine's default. One name is not a config field:
`num_speculative_tokens=K,...` sets speculative_config per point, K = 0 to speculation off and K > 0 to n-gram
speculation with K tokens, or, when --speculative-config is given too, to that config with its
num_speculative_tokens replaced by K (so prompt lookup bounds or a draft model stay as given). Knobs whose values
are JSON or lists (speculative_config, structured_outputs_config, quantization_skip) and model and tokenizer
cannot be varied (the requests are token ids of one tokenizer).

Every combination's whole engine configuration is checked before the first engine loads. Per point the table
gives output tok/s and its ratio to the first combination's and, with more than one --vary, to the point with
the first --vary at its first value and every other knob alike; then the mean and median TPOT, and where they
apply: whether the tokens are the first combination's (greedy runs), the speculative acceptance figures (a
point with speculation on), and tensor parallelism's per-step cost (a point with more than one rank).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from engine.benchmarks.throughput_run import ThroughputResult
from engine.config import KnobSpec, engine_knobs

SPECULATIVE_DEPTH = "num_speculative_tokens"
DEFAULT_VALUE = "default"
NOT_VARIED = {
    "model": "the requests are token ids of one tokenizer; compare models with `bench compare`",
    "tokenizer": "the requests are token ids of one tokenizer",
    "speculative_config": f"its JSON holds commas; vary {SPECULATIVE_DEPTH}=0,2,4 instead",
    "structured_outputs_config": "its JSON holds commas; set it with --structured-outputs-config",
    "quantization_skip": "its value is a comma-separated list; set it with --quantization-skip",
}


class VaryError(ValueError):
    """A --vary that cannot run; the message names the option and the fix."""


@dataclass(frozen=True)
class Vary:
    knob: str
    values: tuple[Any, ...]  # None: the engine's default


def parse_vary(text: str) -> Vary:
    """'dtype=float32,bfloat16' -> Vary('dtype', ('float32', 'bfloat16'))."""
    knob, sep, listed = text.partition("=")
    knob = knob.strip()
    if not sep or not knob:
        raise VaryError(f"--vary takes KNOB=V1,V2,... (e.g. dtype=float32,bfloat16), got {text!r}")
    if knob in NOT_VARIED:
        raise VaryError(f"--vary {knob}: cannot be varied ({NOT_VARIED[knob]})")
    specs = engine_knobs()
    if knob != SPECULATIVE_DEPTH and knob not in specs:
        known = ", ".join([*(name for name in specs if name not in NOT_VARIED), SPECULATIVE_DEPTH])
        raise VaryError(f"--vary {knob}: not an engine knob; the knobs are {known}")
    items = [item.strip() for item in listed.split(",")]
    if not listed.strip() or not all(items):
        raise VaryError(f"--vary {knob}: give comma-separated values, none empty, got {listed!r}")
    values = tuple(_depth_value(item) if knob == SPECULATIVE_DEPTH else _knob_value(specs[knob], item)
                   for item in items)  # fmt: skip
    if len(set(values)) != len(values):
        raise VaryError(f"--vary {knob}: a value appears twice in {listed!r}")
    return Vary(knob, values)


def _depth_value(item: str) -> int:
    try:
        depth = int(item)
    except ValueError:
        depth = -1
    if depth < 0:
        raise VaryError(f"--vary {SPECULATIVE_DEPTH}: values are integers >= 0 (0 = no speculation), got {item!r}")
    return depth


def _knob_value(spec: KnobSpec, item: str) -> Any:
    if item == DEFAULT_VALUE:
        return None
    try:
        return spec.parse_text(item)
    except ValueError as e:
        raise VaryError(f"--vary {spec.name}: {e}") from None


def parse_varies(texts: Sequence[str], set_knobs: Mapping[str, Any]) -> list[Vary]:
    """Every --vary, checked against each other and against the knobs set by their own flags."""
    varies = [parse_vary(text) for text in texts]
    knobs = [vary.knob for vary in varies]
    if repeated := sorted({knob for knob in knobs if knobs.count(knob) > 1}):
        raise VaryError(f"--vary {', '.join(repeated)} given twice: list every value in one --vary")
    for knob in knobs:
        if knob in set_knobs:
            flag = engine_knobs()[knob].flag
            raise VaryError(f"--vary {knob} and {flag} both set it: drop one")
    return varies


def expand_grid(varies: Sequence[Vary]) -> list[dict[str, Any]]:
    """The combinations in run order: {knob: value}, the product of the varies with the first outermost."""
    return [dict(zip([v.knob for v in varies], values, strict=True)) for values in
            itertools.product(*(v.values for v in varies))]  # fmt: skip


def point_knobs(base: Mapping[str, Any], combination: Mapping[str, Any]) -> dict[str, Any]:
    """The engine knobs of one combination: the base knobs with the varied ones applied (None: left unset)."""
    knobs = dict(base)
    for knob, value in combination.items():
        if knob == SPECULATIVE_DEPTH:
            knobs["speculative_config"] = speculative_config(value, base.get("speculative_config"))
        else:
            knobs[knob] = value
    return {knob: value for knob, value in knobs.items() if value is not None}


def speculative_config(depth: int, base: str | None) -> str | None:
    """None for depth 0, else `base` (default: n-gram) with num_speculative_tokens = depth, as the knob's JSON."""
    if depth == 0:
        return None
    config = json.loads(base) if base else {"method": "ngram"}
    if not isinstance(config, dict):
        raise VaryError(f"--speculative-config must be a JSON object to vary {SPECULATIVE_DEPTH}, got {base!r}")
    return json.dumps({**config, SPECULATIVE_DEPTH: depth})


def label(combination: Mapping[str, Any]) -> str:
    return " ".join(f"{knob}={_shown(value)}" for knob, value in combination.items())


def _shown(value: Any) -> str:
    return DEFAULT_VALUE if value is None else str(value).lower() if isinstance(value, bool) else str(value)


@dataclass
class VaryPoint:
    settings: dict[str, Any]  # the varied knobs' values (None: the engine's default)
    result: ThroughputResult
    ratio: float = 1.0  # output tok/s over the first combination's
    ratio_vs_first_value: float | None = None  # over the first --vary's first value, the rest alike (2+ --vary)
    outputs_match: bool | None = None  # greedy only: the same output tokens as the first combination

    def to_json(self) -> dict[str, Any]:
        return {"settings": self.settings, "ratio": self.ratio, "ratio_vs_first_value": self.ratio_vs_first_value,
                "outputs_match": self.outputs_match, **asdict(self.result)}  # fmt: skip


def run_grid(
    varies: Sequence[Vary], base: Mapping[str, Any],
    run: Callable[[dict[str, Any], dict[str, Any]], ThroughputResult],
    on_point: Callable[[VaryPoint], None] = lambda point: None,
) -> list[VaryPoint]:  # fmt: skip
    """Run every combination in turn (`run` gets it and its engine knobs) and compare each with the baselines."""
    import gc

    import torch

    points = []
    for combination in expand_grid(varies):
        threads = torch.get_num_threads()  # an in-process engine sets this process's threads: undo it per point
        try:
            result = run(combination, point_knobs(base, combination))
        finally:
            torch.set_num_threads(threads)
            gc.collect()  # the point's engine goes before the next one loads
        points.append(compare(VaryPoint(combination, result), points, varies))
        on_point(points[-1])
    return points


def compare(point: VaryPoint, earlier: Sequence[VaryPoint], varies: Sequence[Vary]) -> VaryPoint:
    """Fill `point`'s ratios and outputs_match from the points run before it (the first combination first)."""
    first = earlier[0] if earlier else point
    point.ratio = point.result.output_tokens_per_second / first.result.output_tokens_per_second
    if len(varies) > 1:
        knob, value = varies[0].knob, varies[0].values[0]
        baseline = next(p for p in [*earlier, point] if p.settings == {**point.settings, knob: value})
        point.ratio_vs_first_value = point.result.output_tokens_per_second / baseline.result.output_tokens_per_second
    digests = (point.result.greedy_output_sha256, first.result.greedy_output_sha256)
    if None not in digests:
        point.outputs_match = digests[0] == digests[1]
    return point


Column = tuple[str, Callable[[VaryPoint], str]]


def _cell(value: float | None, digits: int = 1) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _columns(points: Sequence[VaryPoint], varies: Sequence[Vary]) -> list[Column]:
    """The table's columns: the settings and throughput always, then each group whose points have its figures."""
    results = [p.result for p in points]
    columns: list[Column] = [(v.knob, lambda p, k=v.knob: _shown(p.settings[k])) for v in varies]
    columns += [
        ("elapsed s", lambda p: f"{p.result.elapsed_time:.1f}"),
        ("total tok/s", lambda p: f"{p.result.tokens_per_second:.1f}"),
        ("output tok/s", lambda p: f"{p.result.output_tokens_per_second:.1f}"),
        ("vs first", lambda p: f"{p.ratio:.2f}×"),
    ]
    if len(varies) > 1:
        first = f"{varies[0].knob}={_shown(varies[0].values[0])}"
        columns.append((f"vs {first}", lambda p: f"{p.ratio_vs_first_value:.2f}×"))
    columns += [("mean TPOT ms", lambda p: _cell(p.result.mean_tpot_ms, 2)),
                ("median TPOT ms", lambda p: _cell(p.result.median_tpot_ms, 2))]  # fmt: skip
    if any(p.outputs_match is not None for p in points):
        columns.append(("same tokens as first", lambda p: {None: "—", True: "yes", False: "NO"}[p.outputs_match]))
    if any(r.acceptance_rate is not None for r in results):
        columns += [
            ("acceptance", lambda p: _cell(p.result.acceptance_rate, 2)),
            ("mean accepted length", lambda p: _cell(p.result.mean_acceptance_length, 2)),
            ("acceptance per position",
             lambda p: " ".join(f"{r:.2f}" for r in p.result.acceptance_rate_per_position or []) or "—"),
        ]  # fmt: skip
    if any(r.tp_step_ms is not None for r in results):
        columns += [
            ("step ms", lambda p: _cell(p.result.tp_step_ms)),
            ("forward ms", lambda p: _cell(p.result.tp_execute_ms)),
            ("collectives ms", lambda p: _cell(p.result.tp_collective_ms)),
            ("step payload B", lambda p: _cell(p.result.tp_step_payload_bytes, 0)),
            ("logits B", lambda p: _cell(p.result.tp_logits_bytes, 0)),
        ]
    return columns


def ratio_table(points: Sequence[VaryPoint], varies: Sequence[Vary]) -> str:
    """A markdown table, one row per point in run order."""
    columns = _columns(points, varies)
    lines = ["| " + " | ".join(header for header, _ in columns) + " |",
             "|" + "|".join("---" if i < len(varies) else "---:" for i in range(len(columns))) + "|"]  # fmt: skip
    lines += ["| " + " | ".join(cell(point) for _, cell in columns) + " |" for point in points]
    return "\n".join(lines)
