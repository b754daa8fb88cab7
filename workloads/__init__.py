"""Workloads: real length mixes, trace loaders, arrival schedules and exact-length prompt synthesis.

    import workloads
    specs = workloads.load("azure-code-2023")                       # all 8,819 rows, source token counts
    specs = workloads.load("sharegpt", num_requests=500, seed=1, max_model_len=2048)   # fitted, see report
    report = workloads.last_fit_report()
    offsets = workloads.arrivals.gamma(rate=4.0, burstiness=0.5, num_requests=500, seed=1)
    prompts = workloads.synthesize(specs, tokenizer, endpoint="chat")   # exact input_len tokens each (*)
    workloads.fidelity(specs, realised_in, realised_out, intended, actual)

Names for load(): the shipped mixes (workloads.list_workloads()), "fixed", "random" (vLLM --random-range-ratio
semantics), "lognormal" (fit_to=<mix>), "shared-prefix", "structured", "mixture:<name>=<weight>,...", or a trace
file path (Azure CSV 2023/2024, Mooncake JSONL, BurstGPT CSV, ShareGPT JSON with tokenizer=, generic CSV/JSONL).

Token counts: a source measured with another tokenizer (Llama-2 for ShareGPT/arXiv/BWB, unnamed production
tokenizers for Azure and Mooncake) keeps its counts; they are used as request sizes for the target model, and
synthesis then makes prompts of exactly that many target-tokenizer tokens. Without max_model_len, load() returns
the source's counts unchanged; with it, fit_policy (clip / drop / rescale, see workloads.fit) applies and
last_fit_report() says how many requests changed.

Shipped mixes: all rows of Azure 2023 code/conv, Mooncake conversation (hash ids), ShareGPT-8k, arXiv, BWB and
the LMSYS sample (620 KB in all), plus servegen-deepseek-r1, a marginal quantile table (resolution 1/1000) with
ServeGen's per-window aggregate rate curve (feed it to arrivals.rate_curve). Rebuild them with
`python -m workloads.derive --raw-dir ../shared/workloads/raw` (or the user's own download).

(*) Except below the chat template's own length (30 tokens for SmolLM2): such a request is clamped to the
shortest possible prompt, and its extra["requested_input_len"] keeps the spec's length (too_short="error" raises).

Sampling a mix: num_requests=None returns every row in trace order (a quantile table: one request per level).
num_requests <= rows draws a seeded random subset without replacement, kept in trace order (a thinned trace:
same burst shape, rate scaled by n/rows); num_requests > rows draws with replacement, also in trace order.
Request classes (per-class SLOs): a generic CSV/JSONL trace's `class` column, else a mixture component's name
(its file stem for a path), in RequestSpec.request_class.
Multi-turn conversation files (ShareGPT, LMSYS-Chat-1M, OpenAI messages) for session workloads: workloads.conversations.
Prompt text sent as it is (not lengths): the TEXT_WORKLOADS (copy-heavy), `prompts:FILE` and the shipped prompt sets
(servelab-prompts) of workloads.prompt_files, and mixtures with a prompt-file component (workloads.text_mixtures);
is_text_workload(name) tells them apart, and load() refuses them.
Replay a timed mix with arrivals.replay([s.timestamp for s in specs], time_scale=..., tick_s=3 for Mooncake).

Deviations from the first API sketch (workloads_contract.md), all additive: RequestSpec has prefix_len and
prefix_block_size; SynthesizedPrompt has prefix_group and extra (holds the salt); arrival functions name their
count num_requests; arrivals also has closed_loop(n), constant(rate, n), rate_curve(...) and replay(..., tick_s=)
for Mooncake's 3 s ticks; ramp(start_rate, end_rate, num_requests, kind, burstiness, seed); synthesize's
block_size is the tokens per hash id when a spec does not carry prefix_block_size; fidelity is also importable as
workloads.fidelity.fidelity.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from workloads import arrivals, copy_heavy, mixes, prefix, prompt_files, structured, synthetic, text_mixtures
from workloads.fidelity import fidelity
from workloads.fit import FIT_POLICIES, fit_to_model
from workloads.loaders import load_trace
from workloads.mixes import list_workloads, load_mix, metadata, shipped_names
from workloads.spec import FitReport, RequestSpec, SynthesizedPrompt, WorkloadFormatError, WorkloadInfo
from workloads.synthesis import synthesize

__all__ = [
    "FIT_POLICIES",
    "FitReport",
    "RequestSpec",
    "SynthesizedPrompt",
    "WorkloadFormatError",
    "WorkloadInfo",
    "arrivals",
    "fidelity",
    "last_fit_report",
    "list_workloads",
    "load",
    "metadata",
    "prefix",
    "structured",
    "synthesize",
    "synthetic",
    "GENERATORS",
    "TEXT_WORKLOADS",
    "copy_heavy",
    "load_texts",
    "is_text_workload",
    "prompt_files",
    "text_mixtures",
]

DEFAULT_NUM_REQUESTS = 1000
_last_fit_report: FitReport | None = None


def last_fit_report() -> FitReport | None:
    """The FitReport of the most recent load() with max_model_len (None if it had none)."""
    return _last_fit_report


def sample(specs: list[RequestSpec], num_requests: int | None, seed: int) -> list[RequestSpec]:
    """A seeded subset (or oversample) kept in source order; None keeps everything."""
    if num_requests is None:
        return specs
    if num_requests < 0:
        raise ValueError(f"num_requests must be >= 0, got {num_requests}")
    rng = np.random.default_rng(seed)
    replace = num_requests > len(specs)
    indices = np.sort(rng.choice(len(specs), size=num_requests, replace=replace))
    return [RequestSpec(**{f: getattr(specs[i], f) for f in RequestSpec.__slots__}) for i in indices]


def _fixed(n: int, seed: int, input_len: int | None, output_len: int | None, range_ratio: float) -> list[RequestSpec]:
    return synthetic.fixed(n, input_len or synthetic.DEFAULT_INPUT_LEN, output_len or synthetic.DEFAULT_OUTPUT_LEN)


def _random(n: int, seed: int, input_len: int | None, output_len: int | None, range_ratio: float) -> list[RequestSpec]:
    return synthetic.random_lengths(n, input_len or 1024, output_len or 128, range_ratio, seed)


def _lognormal(
    n: int,
    seed: int,
    input_len: int | None,
    output_len: int | None,
    range_ratio: float,
    fit_to: str = "azure-conv-2023",
    max_len: int | None = None,
) -> list[RequestSpec]:
    return synthetic.lognormal(n, load(fit_to), seed, max_len)


def _shared_prefix(
    n: int,
    seed: int,
    input_len: int | None,
    output_len: int | None,
    range_ratio: float,
    num_groups: int = 64,
    prefix_len: int = 2048,
    zipf_alpha: float = 0.0,
) -> list[RequestSpec]:
    return prefix.shared_prefix(
        n, num_groups, prefix_len, input_len or 128, output_len or 256, range_ratio, zipf_alpha, seed
    )


def _structured(
    n: int,
    seed: int,
    input_len: int | None,
    output_len: int | None,
    range_ratio: float,
    field_counts: tuple[int, ...] = (1, 4, 16, 64),
) -> list[RequestSpec]:
    base = synthetic.random_lengths(n, input_len or 256, output_len or 256, range_ratio, seed)
    return structured.with_schemas(base, field_counts, seed + 1)


GENERATORS: dict[str, Callable[..., list[RequestSpec]]] = {
    "fixed": _fixed,
    "random": _random,
    "lognormal": _lognormal,
    "shared-prefix": _shared_prefix,
    "structured": _structured,
}


# Workloads given as text (their point is what the prompts say, not their lengths): name -> generator of
# copy_heavy.TextRequest lists, called as (num_requests, seed, output_len=...).
TEXT_WORKLOADS: dict[str, Callable[..., list[copy_heavy.TextRequest]]] = {"copy-heavy": copy_heavy.copy_heavy}


def load_texts(name: str, *, num_requests: int, seed: int = 0, output_len: int = 128) -> list[copy_heavy.TextRequest]:
    """The requests of a text workload (TEXT_WORKLOADS), `num_requests` of them, seeded."""
    if name not in TEXT_WORKLOADS:
        raise ValueError(f"unknown text workload {name!r}; the text workloads are {sorted(TEXT_WORKLOADS)}")
    return TEXT_WORKLOADS[name](num_requests, seed, output_len=output_len)


def is_text_workload(name: str) -> bool:
    """Whether `name` is sent as text (TEXT_WORKLOADS, `prompts:FILE`, a shipped prompt set, or a mixture with a
    prompt-file component: workloads.text_mixtures), not as lengths."""
    return name in TEXT_WORKLOADS or prompt_files.is_prompt_workload(name) or text_mixtures.is_text_mixture(name)


def _mixture(spec: str, num_requests: int, seed: int) -> list[RequestSpec]:
    parsed = text_mixtures.parse_components(spec)
    components = []
    for component in parsed:
        try:
            components.append((load(component.source, seed=seed), component.weight))
        except ValueError as error:
            raise ValueError(f"mixture component {component.source!r}: {error}") from None
    return synthetic.mixture(components, num_requests, seed, [component.name for component in parsed])


def load(
    name_or_path: str | Path,
    *,
    num_requests: int | None = None,
    seed: int = 0,
    input_len: int | None = None,
    output_len: int | None = None,
    range_ratio: float | dict = 0.0,
    max_model_len: int | None = None,
    fit_policy: str = "clip",
    tokenizer: Any = None,
    **options: Any,
) -> list[RequestSpec]:
    """The requests of a shipped mix, a generator or a trace file (see the module docstring)."""
    global _last_fit_report
    name = str(name_or_path)
    if name in shipped_names():
        if options or input_len or output_len:
            raise ValueError(f"shipped mix {name!r} takes no length options; got {sorted(options) or 'lengths'}")
        if mixes.is_quantile_table(name):
            specs = mixes.sample_quantile_table(name, num_requests, seed)
        else:
            specs = sample(load_mix(name), num_requests, seed)
    elif name in GENERATORS:
        generator = GENERATORS[name]
        accepted = list(inspect.signature(generator).parameters)[5:]
        unknown = sorted(set(options) - set(accepted))
        if unknown:
            raise ValueError(f"{name!r} does not take option(s) {unknown}; it takes {accepted}")
        n = DEFAULT_NUM_REQUESTS if num_requests is None else num_requests
        specs = generator(n, seed, input_len, output_len, range_ratio, **options)
    elif text_mixtures.is_text_mixture(name):
        raise ValueError(
            f"{name!r} mixes in a prompt file: its lengths come from the text and the target's tokenizer "
            "(bench sweep --workload, bench workloads show --tokenizer), not from workloads.load"
        )
    elif name.startswith("mixture:"):
        specs = _mixture(name[len("mixture:") :], DEFAULT_NUM_REQUESTS if num_requests is None else num_requests, seed)
    elif Path(name).expanduser().is_file():
        specs = sample(load_trace(Path(name).expanduser(), tokenizer=tokenizer, **options), num_requests, seed)
    elif prompt_files.is_prompt_workload(name):
        raise ValueError(
            f"{name!r} is a prompt-text workload: its lengths come from its text and the target's tokenizer "
            "(bench sweep --workload, bench workloads show --tokenizer), not from workloads.load"
        )
    else:
        known = shipped_names() + list(GENERATORS)
        raise ValueError(f"unknown workload {name!r}: not a file, and not one of {known} or 'mixture:a=w,b=w'")
    _last_fit_report = None
    if max_model_len is not None:
        specs, _last_fit_report = fit_to_model(specs, max_model_len, fit_policy)
    return specs
