"""The longest request a study sends: the shortest `max_model_len` a trial may have.

Each trial fits its prompts to its own `max_model_len` (the sweep's fit policy, clip), so a trial whose context is
shorter than a request measures a lighter workload than the others and can win on that alone. The tuner therefore
removes every `max_model_len` choice below the longest request (prompt + output) from the space, for every
workload kind (generated, shipped mix or trace): `DeviceInfo.min_model_len` and the space's max_model_len filter
(sweep/tune/space.py). The requests counted are exactly those the study's points draw: `workloads.load` with the
study's seed and each prompt count a point can have. A text workload (`prompts:FILE`, a shipped prompt set,
copy-heavy) is measured as the sweep measures it: its text in the target's tokenizer on the study's endpoint, after a
salt of the sweep's shape (`[<12 hex>-<label>] `), so its count can differ from a point's by a token or two.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def prompt_counts(num_prompts: int, load_mode: str, min_load: float, max_load: float) -> list[int]:
    """Every number of requests one point of the study can send. In closed loop a point sends at least one prompt
    per stream (`max(num_prompts, concurrency)`, sweep/tune/backend.py), over every concurrency from `min_load` to
    `max_load` (what the max-load search may try; a fixed load has min_load == max_load)."""
    if load_mode != "concurrency":
        return [num_prompts]
    return sorted({max(num_prompts, load) for load in range(int(min_load), int(max_load) + 1)})


def _trace_tokenizer(path: Path, tokenizer: str) -> Any:
    """A trace that holds text (ShareGPT JSON) is measured with the target's tokenizer; one with counts needs none."""
    from workloads.loaders import detect_format

    if detect_format(path) != "sharegpt":
        return None
    from engine.tokenizer import get_tokenizer

    return get_tokenizer(tokenizer)


SAMPLE_SALT = "0123456789ab-c0001"  # the shape of a sweep point's salt (run salt, point label)


def longest_request(
    workload: str,
    input_len: int | None,
    output_len: int | None,
    seed: int,
    counts: list[int],
    tokenizer: str,
    endpoint: str = "completions",
) -> int:
    """The most tokens (prompt + output, as the source asks, before any fitting) of any request the study's points
    draw; `tokenizer` measures a text trace. A bad workload or trace raises ValueError.

    The counts are drawn largest first, and the draws stop once one holds a request as long as the source's longest
    (a mix's or trace's longest row; `fixed`'s and `random`'s lengths, which the tuner sends unspread): no other
    draw can hold a longer one."""
    import workloads

    path = Path(workload).expanduser()
    ceiling: int | None = None
    if workloads.is_text_workload(workload):
        from engine.tokenizer import get_tokenizer
        from workloads.text_workloads import text_prompts

        target = get_tokenizer(tokenizer)

        def draw(n: int | None) -> list[Any]:
            return text_prompts(workload, endpoint, output_len, target, n, seed, SAMPLE_SALT)[0]

        if workloads.prompt_files.is_prompt_workload(workload):  # a draw of n <= rows is a subset of the rows
            ceiling = _longest(draw(None))
    elif workload not in workloads.shipped_names() and path.is_file():
        # workloads.load draws a trace's requests from all its rows: read them once, draw each count from them
        rows = workloads.load(path, tokenizer=_trace_tokenizer(path, tokenizer))

        def draw(n: int) -> list[Any]:
            return workloads.sample(rows, n, seed)

        ceiling = _longest(rows)
    else:

        def draw(n: int) -> list[Any]:
            return workloads.load(workload, num_requests=n, seed=seed, input_len=input_len, output_len=output_len)

        if workload in workloads.shipped_names() and not workloads.mixes.is_quantile_table(workload):
            ceiling = _longest(workloads.load(workload))
        elif workload in ("fixed", "random"):
            ceiling = _longest(draw(1))
    longest = 1
    for n in sorted(counts, reverse=True):
        longest = max(longest, _longest(draw(n)))
        if ceiling is not None and longest >= ceiling:  # a prompt file's draw past its rows repeats every row
            break
    return longest


def _longest(specs: list[Any]) -> int:
    return max((spec.input_len + spec.output_len for spec in specs), default=1)
