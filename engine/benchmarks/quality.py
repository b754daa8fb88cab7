"""The measurement behind `bench check quality` (the command: quality_command.py): what a quantization or
KV-cache dtype setting costs in quality, measured on a shipped public-domain text.

The text (engine/benchmarks/data/, provenance in its README.md) is tokenized once and cut into windows of
`window` tokens; each window is one prompt scored teacher-forced through the engine's `prompt_logprobs`
(max_tokens=1). Two engines run the same windows: the configuration under test and its reference
(the same knobs with quantization=none and kv_cache_dtype=auto). Reported:

* perplexity = exp(-mean logprob of every window token after the window's first), for both engines, and
  perplexity_increase = perplexity / reference_perplexity - 1;
* top1_agreement = the fraction of those positions where both engines' most likely next token is the same.

A window's first prefill chunk attends over its fresh K/V, not the cache, so a kv_cache_dtype shows only in
later chunks: measure it with --max-num-batched-tokens well below the window.
"""

from __future__ import annotations

import gc
import hashlib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TEXT_PATH = Path(__file__).parent / "data" / "coriolanus_act1.txt"
TEXT_SOURCE = (
    "Shakespeare, Coriolanus (opening): karpathy/char-rnn data/tinyshakespeare/input.txt @ d1d7aa3, chars 0-12852"
)


@dataclass
class TeacherForcedScores:
    """Per scored position (window tokens after each window's first): the token's logprob and the top-1 token."""

    logprobs: list[float]
    top1_token_ids: list[int]

    @property
    def perplexity(self) -> float:
        return math.exp(-sum(self.logprobs) / len(self.logprobs))


@dataclass
class QualityResult:
    model: str
    quantization: str
    kv_cache_dtype: str
    dtype: str
    text: str
    text_sha256: str
    num_windows: int
    window: int
    num_scored_tokens: int
    perplexity: float
    reference_perplexity: float
    perplexity_increase: float  # perplexity / reference_perplexity - 1
    top1_agreement: float


def text_windows(tokenizer: Any, window: int, num_tokens: int | None = None) -> list[list[int]]:
    """The shipped text's token ids (no special tokens), the first `num_tokens` of them, in windows of `window`."""
    if window < 2:
        raise ValueError(f"window must be >= 2 tokens, got {window}")
    ids = tokenizer(TEXT_PATH.read_text(), add_special_tokens=False)["input_ids"]
    if num_tokens is not None:
        if num_tokens < 2:
            raise ValueError(f"num_tokens must be >= 2, got {num_tokens}")
        ids = ids[:num_tokens]
    windows = [ids[start : start + window] for start in range(0, len(ids), window)]
    return [w for w in windows if len(w) >= 2]


def score_windows(llm: Any, windows: list[list[int]]) -> TeacherForcedScores:
    """Each window's prompt logprobs through `llm` (an engine.LLM): every token's logprob and the top-1 token."""
    from engine.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=1)
    outputs = llm.generate([{"prompt_token_ids": w} for w in windows], params, use_tqdm=False)
    logprobs: list[float] = []
    top1: list[int] = []
    for window, output in zip(windows, outputs, strict=True):
        assert output.prompt_logprobs is not None
        for token_id, entry in zip(window[1:], output.prompt_logprobs[1:], strict=True):
            logprobs.append(entry[token_id].logprob)
            top1.append(next(lp.token_id for lp in entry.values() if lp.rank == 1))
    return TeacherForcedScores(logprobs, top1)


def measure_quality(
    knobs: dict[str, Any], window: int = 1024, num_tokens: int | None = None, max_num_batched_tokens: int = 1024
) -> QualityResult:
    """Score the text with the engine configured by `knobs` and with its reference (unquantized, model-dtype KV)."""
    from engine.llm import LLM
    from engine.tokenizer import get_tokenizer

    model = knobs.get("model", "smollm2-135m")
    windows = text_windows(get_tokenizer(knobs.get("tokenizer") or model), window, num_tokens)
    run_knobs = {"max_num_batched_tokens": max_num_batched_tokens, **knobs, "model": model}
    run_knobs.setdefault("max_model_len", max(window, 2) + 1)
    run_knobs.setdefault("max_num_seqs", len(windows))
    reference_knobs = {**run_knobs, "quantization": "none", "kv_cache_dtype": "auto"}
    scores = {}
    for name, engine_knobs in (("reference", reference_knobs), ("run", run_knobs)):
        llm = LLM(**{k: v for k, v in engine_knobs.items() if v is not None})
        scores[name] = score_windows(llm, windows)
        del llm
        gc.collect()
    run, reference = scores["run"], scores["reference"]
    agreement = sum(a == b for a, b in zip(run.top1_token_ids, reference.top1_token_ids, strict=True))
    return QualityResult(
        model=model,
        quantization=run_knobs.get("quantization", "none"),
        kv_cache_dtype=run_knobs.get("kv_cache_dtype", "auto"),
        dtype=run_knobs.get("dtype", "auto"),
        text=TEXT_SOURCE,
        text_sha256=hashlib.sha256(TEXT_PATH.read_bytes()).hexdigest(),
        num_windows=len(windows),
        window=window,
        num_scored_tokens=len(run.logprobs),
        perplexity=run.perplexity,
        reference_perplexity=reference.perplexity,
        perplexity_increase=run.perplexity / reference.perplexity - 1.0,
        top1_agreement=agreement / len(run.top1_token_ids),
    )
