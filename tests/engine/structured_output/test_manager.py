"""Grammar-masked decoding inside EngineCore (tiny-random): constrained outputs follow their grammar, unconstrained
ones are untouched, drafts roll back, preemption rebuilds matchers, a slow compile stalls nobody else."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from typing import Any

import jsonschema
import pytest
import torch

from engine.config import EngineConfig
from engine.engine_core import EngineCore
from engine.request import Request, RequestStatus
from engine.sampler import apply_token_bitmask
from engine.sampling_params import SamplingParams
from engine.structured_output import StructuredOutputsParams
from engine.structured_output.manager import StructuredOutputManager, load_xgrammar_backend

SCHEMA = {
    "type": "object",
    "properties": {
        "ok": {"type": "boolean"},
        "level": {"type": "integer", "minimum": 1, "maximum": 5},
        "color": {"enum": ["red", "green"]},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
    },
    "required": ["ok", "level", "color", "tags"],
    "additionalProperties": False,
}
REGEX = r"[0-9]{3}-[a-c]{2}"
CHOICES = ["alpha", "beta", "gamma"]
EOS = 2


def knobs(**extra: object) -> EngineConfig:
    return EngineConfig.from_kwargs(model="tiny-random", dtype="float32", block_size=4, max_model_len=256, **extra)


@pytest.fixture(scope="module")
def core() -> EngineCore:
    return EngineCore(knobs())


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from engine.tokenizer import get_tokenizer

    return get_tokenizer("tiny-random")


def request(rid: str, prompt: list[int], so: StructuredOutputsParams | None = None, max_tokens: int = 48,
            **params: object) -> Request:  # fmt: skip
    sampling = SamplingParams(max_tokens=max_tokens, structured_outputs=so, **{"temperature": 0.0, **params})
    return Request(rid, list(prompt), sampling, eos_token_id=EOS, max_tokens=max_tokens)


def run(core: EngineCore, requests: list[Request], before_step: Callable[[], None] | None = None) -> dict:
    for r in requests:
        core.add_request(r)
    outputs: dict[str, list[int]] = {r.request_id: [] for r in requests}
    finish: dict[str, str | None] = {}
    while core.has_unfinished_requests():
        if before_step is not None:
            before_step()
        for output in core.step():
            outputs[output.request_id] += output.new_token_ids
            if output.finish_reason is not None:
                finish[output.request_id] = output.finish_reason
    assert core.structured_output_manager.num_tracked == 0
    return {rid: (tokens, finish.get(rid)) for rid, tokens in outputs.items()}


def text(tokenizer: Any, tokens: list[int]) -> str:
    return tokenizer.decode([t for t in tokens if t != EOS])


def constrained(tag: str) -> list[Request]:
    return [
        request(f"{tag}-json", [5, 6, 7, 8], StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True)),
        request(f"{tag}-regex", [9, 10, 11], StructuredOutputsParams(regex=REGEX)),
        request(f"{tag}-choice", [12, 13], StructuredOutputsParams(choice=CHOICES), temperature=1.0, seed=3),
    ]


def check_valid(tokenizer: Any, result: dict, tag: str) -> None:
    for rid, (tokens, finish) in result.items():
        if not rid.startswith(tag):
            continue
        assert finish == "stop" and tokens[-1] == EOS, rid
        out = text(tokenizer, tokens)
        if rid.endswith("json"):
            jsonschema.validate(json.loads(out), SCHEMA)
        elif rid.endswith("regex"):
            assert re.fullmatch(REGEX, out), out
        else:
            assert out in CHOICES


def test_constrained_rows_follow_their_grammar_and_others_are_untouched(core: EngineCore, tokenizer: Any) -> None:
    def free() -> list[Request]:
        return [request("free-greedy", [20, 21, 22], max_tokens=12, ignore_eos=True),
                request("free-seeded", [23, 24], max_tokens=12, ignore_eos=True, temperature=0.9, seed=11)]  # fmt: skip

    alone = run(core, free())
    mixed = run(core, free() + constrained("c"))
    assert mixed["free-greedy"] == alone["free-greedy"] and mixed["free-seeded"] == alone["free-seeded"]
    check_valid(tokenizer, mixed, "c")
    # The unconstrained tiny-random model does not write JSON by itself: the grammar did.
    assert not text(tokenizer, alone["free-greedy"][0]).startswith("{")


def test_bitmask_touches_only_the_constrained_rows() -> None:
    torch.manual_seed(0)
    logits = torch.randn(4, 100)
    reference = logits.clone()
    bitmask = torch.full((4, 4), -1, dtype=torch.int32)
    bitmask[1] = 0
    bitmask[1, 2] = 1 << 5  # token 69 only
    bitmask[3] = 0  # not in rows: must not apply
    out = apply_token_bitmask(logits, bitmask, [1])
    for row in (0, 2, 3):
        assert torch.equal(out[row], reference[row])
    assert torch.isfinite(out[1]).nonzero().flatten().tolist() == [69]


@pytest.fixture(scope="module")
def reference(core: EngineCore) -> dict:
    """The constrained requests' outputs in a plain run (no drafts, no preemption)."""
    return run(core, constrained("ref"))


def test_right_wrong_or_off_grammar_drafts_change_nothing(core: EngineCore, tokenizer: Any, reference: dict) -> None:
    requests = {mode: constrained(mode) for mode in ("right", "wrong", "half")}

    def propose() -> None:
        for mode, batch in requests.items():
            for r in batch:
                if r.is_finished or not r.num_output_tokens:
                    continue
                ref = reference[r.request_id.replace(mode, "ref", 1)][0]
                nxt = ref[r.num_output_tokens : r.num_output_tokens + 3]
                wrong = [t + 1 for t in nxt]  # mostly tokens the grammar refuses
                r.spec_token_ids = nxt if mode == "right" else wrong if mode == "wrong" else nxt[:1] + wrong[1:]
                state = core.structured_output_manager._states[r.request_id]
                assert state.num_accepted == r.num_output_tokens  # matchers never keep a draft

    result = run(core, [r for batch in requests.values() for r in batch], propose)
    for mode in requests:
        assert {k.replace(mode, "ref", 1): v for k, v in result.items() if k.startswith(mode)} == reference, mode
        check_valid(tokenizer, result, mode)


def test_preemption_rebuilds_the_matchers(tokenizer: Any, reference: dict) -> None:
    small_core = EngineCore(knobs(num_gpu_blocks_override=16))
    small = run(small_core, constrained("p") + constrained("q"))
    assert small_core.get_stats().num_preemptions > 0
    for tag in ("p", "q"):
        assert {k.replace(tag, "ref", 1): v for k, v in small.items() if k.startswith(tag)} == reference


class BlockedBackend:
    """load_backend that waits for a test's go-ahead: a compile that takes as long as the test wants."""

    def __init__(self, core: EngineCore) -> None:
        self.go = threading.Event()
        self.core = core

    def __call__(self) -> Any:
        assert self.go.wait(60)
        return load_xgrammar_backend(self.core.config, self.core.vocab_size, self.core.eos_token_ids)


def install(core: EngineCore, manager: StructuredOutputManager) -> None:
    core.structured_output_manager = manager
    core.scheduler.structured_output_manager = manager


def test_a_compiling_grammar_stalls_no_other_request(tokenizer: Any) -> None:
    core = EngineCore(knobs())
    blocked = BlockedBackend(core)
    install(core, StructuredOutputManager(blocked, core.vocab_size))
    waiting = request("w", [5, 6], StructuredOutputsParams(regex=REGEX))
    core.add_request(waiting)
    assert waiting.status == RequestStatus.WAITING_FOR_FSM
    assert core.step() == []  # only a compiling request: the step waits briefly, returns nothing, raises nothing
    free = request("f", [7, 8, 9], max_tokens=5, ignore_eos=True)
    core.add_request(free)
    done: list[str] = []
    while not done:
        done += [o.request_id for o in core.step() if o.finish_reason is not None]
    assert done == ["f"] and waiting.status == RequestStatus.WAITING_FOR_FSM and not waiting.output_token_ids
    blocked.go.set()
    while core.has_unfinished_requests():
        core.step()
    assert re.fullmatch(REGEX, text(tokenizer, waiting.output_token_ids))
    assert waiting.status == RequestStatus.FINISHED_STOPPED and waiting.timing.grammar_compile_time > 0
    assert waiting.timing.num_grammar_bitmask_steps == waiting.num_output_tokens


def test_grammars_are_compiled_once_per_kind_and_spec(core: EngineCore) -> None:
    manager = StructuredOutputManager(
        lambda: load_xgrammar_backend(core.config, core.vocab_size, core.eos_token_ids), core.vocab_size
    )
    install(core, manager)
    try:
        shuffled = json.loads(json.dumps(dict(reversed(list(SCHEMA.items())))))
        same = [StructuredOutputsParams(json=SCHEMA), StructuredOutputsParams(json=json.dumps(shuffled))]
        run(core, [request(f"s{i}", [5, 6], so, max_tokens=4) for i, so in enumerate(same)])
        assert manager.num_compiles == 1
        run(core, [request("s2", [5, 6], StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True), 4),
                   request("s3", [5, 6], StructuredOutputsParams(regex=REGEX), max_tokens=4)])  # fmt: skip
        assert manager.num_compiles == 3
    finally:
        install(core, StructuredOutputManager(manager._load_backend, core.vocab_size))


def test_max_tokens_before_the_grammar_completes_is_length(core: EngineCore) -> None:
    result = run(core, [request("short", [5, 6], StructuredOutputsParams(json=SCHEMA), max_tokens=3)])
    tokens, finish = result["short"]
    assert finish == "length" and len(tokens) == 3


def test_a_grammar_complete_before_min_tokens_stops_the_request(core: EngineCore, tokenizer: Any) -> None:
    so = StructuredOutputsParams(choice=CHOICES)
    result = run(core, [request("early", [12, 13], so, min_tokens=40)])
    tokens, finish = result["early"]
    assert finish == "stop" and tokens[-1] == EOS and len(tokens) < 40
    assert text(tokenizer, tokens) in CHOICES


def test_a_failed_compile_aborts_only_that_request(core: EngineCore) -> None:
    class Failing:
        def compile(self, params: StructuredOutputsParams) -> None:
            raise RuntimeError("[05:44:30] /project/cpp/x.cc:9: the compiler gave up")

    install(core, StructuredOutputManager(Failing, core.vocab_size))  # type: ignore[arg-type]
    try:
        bad = request("bad", [5, 6], StructuredOutputsParams(regex="a+"))
        core.add_request(bad)
        free = request("free", [7, 8], max_tokens=3, ignore_eos=True)
        core.add_request(free)
        outputs = []
        while core.has_unfinished_requests():
            outputs += core.step()
        aborted = [o for o in outputs if o.request_id == "bad"]
        assert [o.finish_reason for o in aborted] == ["abort"]
        assert aborted[0].stop_reason == "grammar compilation failed: the compiler gave up"
        assert sum(len(o.new_token_ids) for o in outputs if o.request_id == "free") == 3
    finally:
        install(core, StructuredOutputManager(
            lambda: load_xgrammar_backend(core.config, core.vocab_size, core.eos_token_ids), core.vocab_size
        ))  # fmt: skip
