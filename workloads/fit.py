"""Fitting token counts to a model's max_model_len by an explicit, recorded policy.

clip:    input capped at max_model_len - 1, then output capped so input + output <= max_model_len.
drop:    requests with input + output > max_model_len are removed.
rescale: a request over the limit is shrunk proportionally (input and output by the same factor, each >= 1),
         keeping its input:output ratio; requests within the limit are untouched.
Token counts from another tokenizer are kept as counts: fitting changes sizes, never re-tokenises.
"""

from __future__ import annotations

import dataclasses
import math

from workloads.spec import FitReport, RequestSpec

FIT_POLICIES = ("clip", "drop", "rescale")


def _trim_prefix(spec: RequestSpec, new_input: int) -> list[int] | None:
    if spec.prefix_ids is None:
        return None
    if spec.prefix_block_size:
        return spec.prefix_ids[: math.ceil(new_input / spec.prefix_block_size)]
    return spec.prefix_ids[: math.ceil(len(spec.prefix_ids) * new_input / spec.input_len)]


def fit_to_model(
    specs: list[RequestSpec], max_model_len: int, policy: str = "clip"
) -> tuple[list[RequestSpec], FitReport]:
    if policy not in FIT_POLICIES:
        raise ValueError(f"fit_policy must be one of {FIT_POLICIES}, got {policy!r}")
    if max_model_len < 2:
        raise ValueError(f"max_model_len must be >= 2 (one prompt and one output token), got {max_model_len}")
    fitted: list[RequestSpec] = []
    dropped = input_changed = output_changed = changed = 0
    for spec in specs:
        if spec.input_len + spec.output_len <= max_model_len:
            fitted.append(spec)
            continue
        if policy == "drop":
            dropped += 1
            continue
        if policy == "clip":
            new_input = min(spec.input_len, max_model_len - 1)
            new_output = max(1, min(spec.output_len, max_model_len - new_input))
        else:
            scale = max_model_len / (spec.input_len + spec.output_len)
            new_input = max(1, math.floor(spec.input_len * scale))
            new_output = max(1, min(math.floor(spec.output_len * scale), max_model_len - new_input))
        changed += 1
        input_changed += new_input != spec.input_len
        output_changed += new_output != spec.output_len
        fitted.append(
            dataclasses.replace(
                spec,
                input_len=new_input,
                output_len=new_output,
                prefix_ids=_trim_prefix(spec, new_input),
                prefix_len=min(spec.prefix_len, new_input) if spec.prefix_len is not None else None,
            )
        )
    report = FitReport(
        policy=policy,
        max_model_len=max_model_len,
        total=len(specs),
        kept=len(fitted),
        changed=changed,
        dropped=dropped,
        input_changed=input_changed,
        output_changed=output_changed,
    )
    return fitted, report
