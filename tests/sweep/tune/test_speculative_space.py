"""The fields of speculative_config as tuner knobs: default draws, pinning and ranging, K = 0 is off, and the
assembly into the engine's --speculative-config JSON."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import optuna
import pytest

from engine.config import SpeculativeConfig, knob_args
from sweep.tune.space import (
    DeviceInfo,
    SearchSpace,
    SpaceError,
    build_space,
    fill_template,
    known_constraint_violation,
    serve_command,
)
from sweep.tune.speculative_space import KNOB_NAMES, METHOD, NUM_TOKENS, assemble

CPU = DeviceInfo(device="cpu", model_max_len=2048, min_model_len=600)


def space_file(tmp_path: Path, knobs: dict[str, Any]) -> Path:
    path = tmp_path / "space.json"
    path.write_text(json.dumps(knobs))
    return path


def draws(space: SearchSpace, n: int) -> list[dict[str, Any]]:
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    return [space.suggest(study.ask()) for _ in range(n)]


def test_the_default_space_searches_the_depth_with_zero_for_off() -> None:
    space = build_space(CPU)
    depth = next(k for k in space.knobs if k.name == NUM_TOKENS)
    assert depth.choices == [0, 2, 4, 6] and space.fixed[METHOD] == "ngram"
    assert "speculative_config" not in space.names
    configs = {knobs["speculative_config"] for knobs in draws(space, 40)}
    assert None in configs  # K = 0: no speculation
    parsed = [SpeculativeConfig.from_json(raw) for raw in configs - {None}]
    assert {(c.method, c.num_speculative_tokens) for c in parsed} == {("ngram", 2), ("ngram", 4), ("ngram", 6)}
    assert all(not name.startswith("speculative_config.") for knobs in draws(space, 5) for name in knobs)


def test_k_zero_gives_no_flag_and_a_depth_gives_the_engine_json(tmp_path: Path) -> None:
    off = build_space(CPU, space_file(tmp_path, {NUM_TOKENS: 0, "max_num_seqs": 4}))
    (knobs,) = draws(off, 1)
    assert knobs["speculative_config"] is None and "--speculative-config" not in knob_args(knobs)
    assert "--speculative-config" not in serve_command("tiny-random", knobs)
    on = build_space(
        CPU,
        space_file(
            tmp_path,
            {NUM_TOKENS: 3, "speculative_config.prompt_lookup_max": 4, "speculative_config.prompt_lookup_min": 2},
        ),
    )
    (knobs,) = draws(on, 1)
    args = knob_args({"speculative_config": knobs["speculative_config"]})
    assert args[0] == "--speculative-config"
    assert json.loads(args[1]) == {
        "method": "ngram",
        "num_speculative_tokens": 3,
        "prompt_lookup_max": 4,
        "prompt_lookup_min": 2,
    }
    command = shlex.split(serve_command("tiny-random", knobs))
    assert command[command.index("--speculative-config") + 1] == args[1]


def test_a_space_file_ranges_the_depth_and_pins_a_draft_model(tmp_path: Path) -> None:
    path = space_file(
        tmp_path, {NUM_TOKENS: {"low": 1, "high": 3}, METHOD: "draft_model", "speculative_config.model": "tiny-random"}
    )
    space = build_space(CPU, path)
    depth = next(k for k in space.knobs if k.name == NUM_TOKENS)
    assert depth.kind == "int" and (depth.low, depth.high) == (1, 3)
    for knobs in draws(space, 10):
        config = SpeculativeConfig.from_json(knobs["speculative_config"])
        assert config is not None and config.method == "draft_model" and config.model == "tiny-random"
        assert 1 <= config.num_speculative_tokens <= 3
    assert space.grid()[NUM_TOKENS] == [1, 2, 3]


def test_the_method_can_be_searched_and_ngram_fields_apply_to_ngram_only(tmp_path: Path) -> None:
    path = space_file(
        tmp_path,
        {
            NUM_TOKENS: 2,
            METHOD: {"choices": ["ngram", "draft_model"]},
            "speculative_config.model": "tiny-random",
            "speculative_config.prompt_lookup_max": 3,
        },
    )
    space = build_space(CPU, path)
    configs = {SpeculativeConfig.from_json(k["speculative_config"]) for k in draws(space, 20)}
    assert {c.method for c in configs if c is not None} == {"ngram", "draft_model"}
    for config in configs:
        assert config is not None
        assert (config.model, config.prompt_lookup_max) == (
            ("tiny-random", None) if config.method == "draft_model" else (None, 3)
        )


def test_dropping_or_pinning_speculative_config_as_a_whole(tmp_path: Path) -> None:
    dropped = build_space(CPU, space_file(tmp_path, {"speculative_config": None}))
    assert not any(name.startswith("speculative_config") for name in [*dropped.names, *dropped.fixed])
    assert "speculative_config" not in draws(dropped, 1)[0]
    raw = json.dumps({"method": "ngram", "num_speculative_tokens": 5})
    pinned = build_space(CPU, space_file(tmp_path, {"speculative_config": raw}))
    assert pinned.fixed["speculative_config"] == raw and not set(KNOB_NAMES) & {*pinned.names, *pinned.fixed}
    assert draws(pinned, 1)[0]["speculative_config"] == raw
    dropped_depth = build_space(CPU, space_file(tmp_path, {NUM_TOKENS: None}))
    assert draws(dropped_depth, 1)[0]["speculative_config"] is None  # no depth: speculation stays off


@pytest.mark.parametrize(("knobs", "message"), [
    ({"speculative_config.foo": 1}, "unknown knob 'speculative_config.foo'"),
    ({"speculative_config": None, NUM_TOKENS: 2}, "give speculative_config or its fields"),
    ({NUM_TOKENS: 2, METHOD: "draft_model"}, "needs speculative_config.model"),
    ({NUM_TOKENS: {"choices": [-1, 2]}}, "must be >= 0"),
    ({METHOD: {"choices": ["ngram", "medusa"]}}, "['medusa'] is not a method"),
])  # fmt: skip
def test_bad_speculative_knobs_are_clear_errors(tmp_path: Path, knobs: dict[str, Any], message: str) -> None:
    with pytest.raises(SpaceError, match=message.replace("[", r"\[").replace("]", r"\]")) as err:
        build_space(CPU, space_file(tmp_path, knobs))
    if "unknown knob" in message:  # the valid names are listed: the engine knobs and the fields
        assert all(name in str(err.value) for name in ["max_num_seqs", *KNOB_NAMES])


def test_assembly_and_its_constraints() -> None:
    assert assemble({"max_num_seqs": 4}) == {"max_num_seqs": 4}  # no fields: unchanged
    assert assemble({NUM_TOKENS: None, METHOD: "ngram"}) == {"speculative_config": None}
    lookups = {NUM_TOKENS: 2, "speculative_config.prompt_lookup_max": 2, "speculative_config.prompt_lookup_min": 4}
    violation = known_constraint_violation(assemble(lookups), None)
    assert violation is not None and "prompt_lookup_min (4) must be >= 1 and <= prompt_lookup_max (2)" in violation
    assert known_constraint_violation(assemble({NUM_TOKENS: 2}), None) is None


def test_a_template_can_use_the_assembled_flag(tmp_path: Path) -> None:
    space = build_space(CPU, space_file(tmp_path, {NUM_TOKENS: {"choices": [0, 4]}}))
    template = "vllm serve {model} {speculative_config_flag}"
    assert fill_template(template, "m", space.placeholder_knobs()) == "vllm serve m"  # checked before any trial
    on = assemble({NUM_TOKENS: 4, METHOD: "ngram"})
    assert shlex.split(fill_template(template, "m", on)) == [
        "vllm",
        "serve",
        "m",
        "--speculative-config",
        on["speculative_config"],
    ]
