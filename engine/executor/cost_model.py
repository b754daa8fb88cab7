"""A step-time cost model: how long the model runner takes for one SchedulerOutput, fitted to measured steps.

A step's shape (`StepShape`) is what its cost depends on: the tokens it runs (every linear layer's rows), the
requests it runs (per-sequence work: the LM head row, attention launch), the context a decode reads from the KV
cache and the query-key pairs a prefill chunk attends over. The model is

    t = overhead + a * tokens + sum_k b_k * min(tokens, k) + sum_k c_k * max(tokens - k, 0)
        + d * seqs + e * decode_context_tokens + f * prefill_attention_pairs

with every coefficient >= 0 (non-negative least squares on relative error): piecewise linear, increasing and
concave or convex in tokens between the breakpoints `k` as the measurements say (a GEMM gets cheaper per row as
batches grow, until it is compute bound), and linear in the attention terms.

`bench model profile` times the model runner and the sampler only. A served step also pays what surrounds them: the
engine core's scheduling, sampling metadata and output queue, and, for every token it streams, the API process's
detokenisation, SSE framing and HTTP write (on a CPU machine, on the same cores as the model). Those costs are
`serving` terms, fitted from measured `bench sweep` runs (sweep/serving_fit.py, `bench profile-serving`):

    t_served = t + serving.step_overhead + serving.per_seq * seqs

The same `serving` object may hold the API process's hand-over terms (HAND_OVER_TERMS, seconds per request and per
prompt token), which delay a request's entry into the engine rather than any step (sweep/simulate_api.py).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from engine.scheduler_output import SchedulerOutput

DEFAULT_BREAKPOINTS = (16, 128, 512)
FEATURES = ("overhead", "tokens", "seqs", "decode_context_tokens", "prefill_attention_kpairs")
SERVING_TERMS = ("step_overhead", "per_seq")  # seconds per step, seconds per sequence in the step
HAND_OVER_TERMS = ("hand_over_per_request", "hand_over_per_prompt_token")  # API process: seconds; none: no delay


@dataclass(frozen=True)
class StepShape:
    """What one engine step runs. `prefill_attention_kpairs`: thousands of (query, key) pairs of prefill chunks."""

    num_prefill_tokens: int = 0
    num_decode_seqs: int = 0
    decode_context_tokens: int = 0  # keys the decodes attend over (their context + the new token)
    num_prefill_seqs: int = 0
    prefill_attention_kpairs: float = 0.0

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_seqs

    @property
    def num_seqs(self) -> int:
        return self.num_prefill_seqs + self.num_decode_seqs

    @classmethod
    def of(cls, scheduler_output: SchedulerOutput) -> StepShape:
        """The shape of a planned step: a request running one token is a decode, any other runs a prefill chunk
        (or a verification of drafts) over `num_computed_tokens` tokens of context."""
        prefill_tokens = decode_seqs = decode_context = prefill_seqs = 0
        pairs = 0.0
        for scheduled in scheduler_output.scheduled:
            query, context = scheduled.num_scheduled_tokens, scheduled.request.num_computed_tokens
            if query == 1:
                decode_seqs += 1
                decode_context += context + 1
            else:
                prefill_seqs += 1
                prefill_tokens += query
                pairs += query * (context + (query + 1) / 2)
        return cls(prefill_tokens, decode_seqs, decode_context, prefill_seqs, pairs / 1000.0)


@dataclass
class CostModel:
    """Fitted step time in seconds; `coefficients` by feature name (see the module docstring)."""

    coefficients: dict[str, float]
    breakpoints: tuple[int, ...] = DEFAULT_BREAKPOINTS
    fit_error: dict[str, float] = field(default_factory=dict)
    serving: dict[str, float] = field(default_factory=dict)  # SERVING_TERMS; empty: the runner's time alone

    def step_time(self, shape: StepShape) -> float:
        t = float(features(shape, self.breakpoints) @ self._vector())
        if self.serving:
            t += self.serving.get("step_overhead", 0.0) + self.serving.get("per_seq", 0.0) * shape.num_seqs
        return t

    @property
    def hand_over(self) -> tuple[float, float] | None:
        """(seconds per request, seconds per prompt token) of the API process's hand-over; None when the
        profile has neither term (requests reach the engine when sent)."""
        if not any(name in self.serving for name in HAND_OVER_TERMS):
            return None
        return tuple(self.serving.get(name, 0.0) for name in HAND_OVER_TERMS)  # type: ignore[return-value]

    def _vector(self) -> np.ndarray:
        return np.array([self.coefficients.get(name, 0.0) for name in feature_names(self.breakpoints)])

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "breakpoints": list(self.breakpoints)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CostModel:
        try:
            coefficients = {str(k): float(v) for k, v in data["coefficients"].items()}
            breakpoints = tuple(int(b) for b in data.get("breakpoints", DEFAULT_BREAKPOINTS))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ValueError(f"not a cost model: {type(e).__name__}: {e}") from None
        try:
            serving = {str(k): float(v) for k, v in (data.get("serving") or {}).items()}
        except (TypeError, ValueError, AttributeError) as e:
            raise ValueError(f"cost model: serving terms: {type(e).__name__}: {e}") from None
        unknown = set(coefficients) - set(feature_names(breakpoints))
        unknown |= {f"serving.{k}" for k in set(serving) - set(SERVING_TERMS) - set(HAND_OVER_TERMS)}
        if unknown:
            raise ValueError(f"cost model: unknown coefficient(s) {sorted(unknown)}")
        if any(v < 0 or not np.isfinite(v) for v in [*coefficients.values(), *serving.values()]):
            raise ValueError(f"cost model: coefficients must be finite and >= 0, got {coefficients} {serving}")
        return cls(coefficients, breakpoints, dict(data.get("fit_error") or {}), serving)

    @classmethod
    def from_json(cls, text: str) -> CostModel:
        return cls.from_dict(json.loads(text))


def feature_names(breakpoints: Sequence[int]) -> list[str]:
    return [
        *FEATURES[:2],
        *(f"tokens_below_{k}" for k in breakpoints),
        *(f"tokens_above_{k}" for k in breakpoints),
        *FEATURES[2:],
    ]


def features(shape: StepShape, breakpoints: Sequence[int]) -> np.ndarray:
    tokens = shape.num_tokens
    return np.array(
        [
            1.0,
            tokens,
            *(min(tokens, k) for k in breakpoints),
            *(max(tokens - k, 0) for k in breakpoints),
            shape.num_seqs,
            shape.decode_context_tokens,
            shape.prefill_attention_kpairs,
        ],
        dtype=float,
    )


def nnls(a: np.ndarray, b: np.ndarray, max_iter: int = 500) -> np.ndarray:
    """min ||a x - b|| subject to x >= 0 (Lawson and Hanson's active-set method)."""
    n = a.shape[1]
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    for _ in range(max_iter):
        gradient = a.T @ (b - a @ x)
        candidates = ~passive & (gradient > 1e-12 * max(1.0, float(np.abs(gradient).max())))
        if not candidates.any():
            break
        passive[np.argmax(np.where(candidates, gradient, -np.inf))] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            blocking = passive & (z <= 0)
            alpha = np.min(x[blocking] / (x[blocking] - z[blocking]))
            x = x + alpha * (z - x)
            passive &= x > 1e-15
            x[~passive] = 0.0
    return x


def fit(
    shapes: Sequence[StepShape], times: Sequence[float], breakpoints: Sequence[int] = DEFAULT_BREAKPOINTS
) -> CostModel:
    """Fit to measured step times (seconds), minimising relative error; `fit_error` holds the in-sample and the
    leave-one-out mean and max relative errors. Breakpoints without two measured step sizes on each side are
    dropped."""
    if len(shapes) != len(times) or not shapes:
        raise ValueError(f"need as many step times as shapes (got {len(shapes)} shapes, {len(times)} times)")
    if any(not t > 0 for t in times):
        raise ValueError("step times must be > 0 seconds")
    counts = sorted({s.num_tokens for s in shapes})
    # A breakpoint needs two distinct measured sizes on each side, or its slope is a guess (and extrapolates).
    kept = tuple(k for k in breakpoints if sum(c <= k for c in counts) >= 2 and sum(c > k for c in counts) >= 2)
    x = np.stack([features(s, kept) for s in shapes])
    y = np.asarray(times, dtype=float)

    def solve(rows: np.ndarray) -> np.ndarray:
        scale = x[rows].max(axis=0)
        scale[scale == 0] = 1.0
        weights = 1.0 / y[rows]
        return nnls(x[rows] / scale * weights[:, None], np.ones(len(y[rows]))) / scale

    everything = np.arange(len(y))
    coefficients = solve(everything)
    in_sample = np.abs(x @ coefficients - y) / y
    held_out = []
    for i in everything if len(y) > len(coefficients) else []:
        c = solve(everything[everything != i])
        held_out.append(abs(float(x[i] @ c) - y[i]) / y[i])
    error = {"mean_rel_error": float(in_sample.mean()), "max_rel_error": float(in_sample.max())}
    if held_out:
        error |= {"loo_mean_rel_error": float(np.mean(held_out)), "loo_max_rel_error": float(np.max(held_out))}
    names = feature_names(kept)
    return CostModel({n: float(c) for n, c in zip(names, coefficients, strict=True)}, kept, error)
