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

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any


def prompt_counts(num_prompts: int | None, load_mode: str, min_load: float, max_load: float,
                  duration: float | None = None, turns: int = 1) -> list[int]:
    """Every number of requests one point of the study can send (`TrialWorkload.prompts_for`, sweep/tune/backend.py).
    In closed loop a point sends at least one prompt per stream (`max(num_prompts, concurrency)`; with `turns` per
    session, a session's turns per stream), over every concurrency from `min_load` to `max_load` (what the max-load
    search may try; a fixed load has min_load == max_load). With --duration alone (`num_prompts` None) a point
    draws the sweep's duration pool (`PointSpec.pool_size`): `rate x duration` requests at every rate the search
    may try, or the closed loop's pool per concurrency, and `turns` prompts per pooled session. A replay sends the
    trace's first `num_prompts` rows (all of them with --duration alone: no count)."""
    from sweep.point.runner import PointSpec

    if load_mode == "replay":
        return [num_prompts] if num_prompts is not None else []
    if num_prompts is not None:
        if load_mode != "concurrency":
            return [num_prompts]
        return sorted({max(num_prompts, load * turns) for load in range(int(min_load), int(max_load) + 1)})
    assert duration is not None, "a point sends --num-prompts requests or runs for --duration"
    if load_mode == "rate":
        pools = range(math.ceil(round(min_load, 2) * duration), math.ceil(round(max_load, 2) * duration) + 1)
        return sorted({max(1, pool) * turns for pool in pools})
    return sorted({
        PointSpec(label="c", mode="concurrency", concurrency=load, duration=duration).pool_size * turns
        for load in range(int(min_load), int(max_load) + 1)
    })


def _trace_tokenizer(path: Path, tokenizer: str) -> Any:
    """A trace that holds text (ShareGPT JSON) is measured with the target's tokenizer; one with counts needs none."""
    from workloads.loaders import detect_format

    if detect_format(path) != "sharegpt":
        return None
    from engine.tokenizer import get_tokenizer

    return get_tokenizer(tokenizer)


SAMPLE_SALT = "0123456789ab-c0001"  # the shape of a sweep point's salt (run salt, point label)
# A conversation's turn is measured after the sample salt, and each trial's run salt is other hex digits, which can
# take a token or two more: a session floor allows each of the run salt's 12 digits a token of its own, so no
# trial's context ends a session a turn early.
SALT_ALLOWANCE = len(SAMPLE_SALT.split("-")[0])


def longest_request(
    workload: str,
    input_len: int | None,
    output_len: int | None,
    seed: int,
    counts: list[int],
    tokenizer: str,
    endpoint: str = "completions",
    *,
    turns: int = 1,
    conversations: str | None = None,
    sessions_counted: bool = False,
    replay: bool = False,
) -> int:
    """The most tokens (prompt + output, as the source asks, before any fitting) of any request the study's points
    draw; `tokenizer` measures a text trace. A bad workload or trace raises ValueError.

    The counts are drawn largest first, and the draws stop once one holds a request as long as the source's longest
    (a mix's or trace's longest row; `fixed`'s and `random`'s lengths, which the tuner sends unspread): no other
    draw can hold a longer one.

    Sessions send their history: with `turns` > 1 a point's prompts form sessions of `turns` consecutive ones
    (sweep.point.sessions), and a session's last turn carries every earlier prompt and reply, so the longest
    request is the longest session's sum of prompt and output tokens, plus the chat template's tokens around each
    earlier reply (`reply_overhead`). With `conversations` (a conversation file) the requests are its recorded
    turns, each with its recorded history (workloads.sessions.conversation_sessions, measured in `tokenizer`):
    `counts` are turns, or sessions when `sessions_counted` (--duration alone), and the largest count's draw holds
    every smaller one's; the floor adds `SALT_ALLOWANCE` for the run salt's tokens. With `replay` the requests are
    the trace's first `max(counts)` rows (all of them without a count)."""
    if conversations is not None:
        return _longest_conversation_turn(conversations, seed, counts, tokenizer, sessions_counted)
    if replay:
        return _longest_replayed(workload, seed, counts, tokenizer)
    draw, ceiling = _drawer(workload, input_len, output_len, seed, tokenizer, endpoint)
    overhead = reply_overhead(tokenizer) if turns > 1 else 0
    if ceiling is not None and turns > 1:
        ceiling = ceiling * turns + overhead * (turns - 1)  # a session no longer than `turns` longest rows
    longest = 1
    for n in sorted(counts, reverse=True):
        longest = max(longest, _longest_session(draw(n), turns, overhead))
        if ceiling is not None and longest >= ceiling:  # a prompt file's draw past its rows repeats every row
            break
    return longest


def _drawer(workload: str, input_len: int | None, output_len: int | None, seed: int, tokenizer: str,
            endpoint: str) -> tuple[Callable[[int], list[Any]], int | None]:
    """`draw(n)`: the specs of a point of n requests, and the source's longest row when it is known."""
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
    return draw, ceiling  # type: ignore[return-value]


def reply_overhead(tokenizer: str) -> int:
    """Tokens a session's history adds per earlier turn beyond that turn's prompt and reply: the chat template
    around the reply, less what a lone turn's prompt already counts (a default system prompt, the generation
    prompt); 0 when it takes none (or the tokenizer has no chat template)."""
    from engine.tokenizer import get_tokenizer
    from workloads.synthesis import chat_prompt_len

    target = get_tokenizer(tokenizer)
    user, reply = {"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}
    try:
        turn = chat_prompt_len(target, [user])
        history = chat_prompt_len(target, [user, reply, user])
    except Exception:  # no chat template: the sweep's chat requests would fail alike in every trial
        return 0
    return max(0, history - 2 * turn - len(target.encode("y", add_special_tokens=False)))


def _longest_session(specs: list[Any], turns: int, overhead: int) -> int:
    """The longest request of `specs` sent as sessions of `turns` consecutive ones (one request each when 1)."""
    if turns == 1:
        return _longest(specs)
    sessions = [specs[i : i + turns] for i in range(0, len(specs), turns)]
    return max((_longest([s]) if len(s) == 1 else sum(r.input_len + r.output_len for r in s)
                + overhead * (len(s) - 1) for s in sessions), default=1)  # fmt: skip


def _longest_conversation_turn(path: str, seed: int, counts: list[int], tokenizer: str, sessions: bool) -> int:
    from engine.tokenizer import get_tokenizer
    from workloads.sessions import conversation_sessions

    n = max(counts, default=1)
    specs, _ = conversation_sessions(path, get_tokenizer(tokenizer), None if sessions else n, n, seed, SAMPLE_SALT)
    return _longest(specs) + SALT_ALLOWANCE


def _longest_replayed(workload: str, seed: int, counts: list[int], tokenizer: str) -> int:
    """The longest of the trace's first rows a replay sends; a workload without timestamps is a ValueError."""
    import workloads
    from workloads.replay import require_timestamps

    path = Path(workload).expanduser()
    is_file = workload not in workloads.shipped_names() and path.is_file()
    specs = workloads.load(workload, num_requests=None, seed=seed,
                           **({"tokenizer": _trace_tokenizer(path, tokenizer)} if is_file else {}))  # fmt: skip
    require_timestamps(workload, specs)
    return _longest(specs[: max(counts)] if counts else specs)


def _longest(specs: list[Any]) -> int:
    return max((spec.input_len + spec.output_len for spec in specs), default=1)
