"""The fields of the engine's `speculative_config` as tuner knobs of their own.

`speculative_config.num_speculative_tokens` (K; 0 = speculation off), `speculative_config.method` (ngram or
draft_model), `speculative_config.model` (the draft's alias or path) and `speculative_config.prompt_lookup_max` /
`prompt_lookup_min` can be searched, pinned or dropped by a space file like any engine knob. A trial's values
assemble into one `speculative_config` JSON, the engine's `--speculative-config`; with K = 0 (or K not in the
space) into none, so the engine runs without speculation and the other fields are ignored.

The default space derives these knobs from the engine's own search range for `speculative_config` (engine/
config.py): K over its depths plus 0 for its `None`, the method over its methods. A space file may instead name
`speculative_config` itself (pin a JSON, search JSON choices, or drop it with null, which also drops the fields);
naming both it and a field is an error.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from engine.config import SPECULATIVE_METHODS, ConfigError, SpeculativeConfig

PREFIX = "speculative_config."
NUM_TOKENS = PREFIX + "num_speculative_tokens"
METHOD = PREFIX + "method"
MODEL = PREFIX + "model"
LOOKUP_MAX = PREFIX + "prompt_lookup_max"
LOOKUP_MIN = PREFIX + "prompt_lookup_min"
KNOB_NAMES = (NUM_TOKENS, METHOD, MODEL, LOOKUP_MAX, LOOKUP_MIN)


def is_speculative_knob(name: str) -> bool:
    return name.startswith(PREFIX)


def default_choices(engine_choices: Sequence[str | None]) -> dict[str, list[Any]]:
    """The field knobs' default choices, from the engine's JSON choices for `speculative_config` (None = off)."""
    configs = [SpeculativeConfig.from_json(raw) for raw in engine_choices]
    depths = sorted({0 if c is None else c.num_speculative_tokens for c in configs})
    methods = list(dict.fromkeys(c.method for c in configs if c is not None)) or ["ngram"]
    choices: dict[str, list[Any]] = {NUM_TOKENS: depths, METHOD: methods}
    if models := list(dict.fromkeys(c.model for c in configs if c is not None and c.model is not None)):
        choices[MODEL] = models
    return choices


def possible_values(name: str, knobs: dict[str, Any], fixed: dict[str, Any]) -> list[Any] | None:
    """The values a trial can draw for a field knob: its choices, its pinned value, or None when it is not in the
    space (or is a range)."""
    if name in fixed:
        return [fixed[name]]
    knob = knobs.get(name)
    return None if knob is None or knob.choices is None else list(knob.choices)


def check_space(knobs: dict[str, Any], fixed: dict[str, Any]) -> list[str]:
    """Errors (SpaceError text) for field knobs that cannot assemble into a config, as a list; empty when fine."""
    errors: list[str] = []
    methods = possible_values(METHOD, knobs, fixed)
    if methods is not None and (bad := [m for m in methods if m not in SPECULATIVE_METHODS]):
        errors.append(f"{METHOD}: {bad} is not a method; the methods are {list(SPECULATIVE_METHODS)}")
    may_draft = "draft_model" in (methods or [])
    if may_draft and MODEL not in fixed and MODEL not in knobs:
        errors.append(f"{METHOD} draft_model needs {MODEL} (the draft's alias or path): pin it in the space file")
    depth = knobs.get(NUM_TOKENS)
    depths = [d for d in possible_values(NUM_TOKENS, knobs, fixed) or [] if d is not None]
    if depth is not None and depth.low is not None:
        depths.append(depth.low)
    if depths and min(depths) < 0:
        errors.append(f"{NUM_TOKENS}: must be >= 0 (0 = speculation off), got {min(depths)}")
    return errors


def assemble(values: dict[str, Any]) -> dict[str, Any]:
    """Engine knobs from a trial's values: the field knobs become one `speculative_config` JSON (None when K is 0
    or unset). Values without field knobs come back unchanged."""
    fields = {name[len(PREFIX) :]: value for name, value in values.items() if is_speculative_knob(name)}
    if not fields:
        return dict(values)
    knobs = {name: value for name, value in values.items() if not is_speculative_knob(name)}
    k = fields.get("num_speculative_tokens")
    if not k:
        knobs["speculative_config"] = None
        return knobs
    method = fields.get("method") or "ngram"
    config: dict[str, Any] = {"method": method, "num_speculative_tokens": int(k)}
    if method == "draft_model":
        config["model"] = fields.get("model")
    else:
        lookups = {n: fields.get(n) for n in ("prompt_lookup_max", "prompt_lookup_min")}
        config |= {n: int(v) for n, v in lookups.items() if v is not None}
    knobs["speculative_config"] = json.dumps(config)
    return knobs


def config_violation(raw: str | None) -> str | None:
    """Why an assembled `speculative_config` is one the engine refuses (prompt_lookup_min above max, say)."""
    try:
        SpeculativeConfig.from_json(raw)
    except ConfigError as err:
        return str(err)
    return None
