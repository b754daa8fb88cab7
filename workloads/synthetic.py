"""Synthetic length mixes: fixed, vLLM-style random, lognormal fitted to a trace, and mixtures."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from workloads.spec import RequestSpec

DEFAULT_INPUT_LEN = 512  # the "512/128" baseline people compare with
DEFAULT_OUTPUT_LEN = 128


def fixed(
    num_requests: int, input_len: int = DEFAULT_INPUT_LEN, output_len: int = DEFAULT_OUTPUT_LEN
) -> list[RequestSpec]:
    _check_lengths(input_len, output_len)
    return [RequestSpec(input_len=input_len, output_len=output_len) for _ in range(num_requests)]


def _check_lengths(input_len: int, output_len: int) -> None:
    if input_len < 1 or output_len < 1:
        raise ValueError(f"input_len and output_len must be >= 1, got {input_len} and {output_len}")


def _ratio(range_ratio: float | dict, key: str) -> float:
    ratio = range_ratio.get(key, 0.0) if isinstance(range_ratio, dict) else range_ratio
    if not 0.0 <= ratio < 1.0:
        raise ValueError(f"range_ratio must be in [0, 1) (vLLM semantics), got {ratio}")
    return float(ratio)


def random_lengths(
    num_requests: int,
    input_len: int = 1024,
    output_len: int = 128,
    range_ratio: float | dict = 0.0,
    seed: int = 0,
) -> list[RequestSpec]:
    """vLLM `--dataset-name random`: lengths uniform integers in [floor(L(1-r)), ceil(L(1+r))] (symmetric),
    r = range_ratio, a float or {"input": r1, "output": r2}; output low bound at least 1."""
    _check_lengths(input_len, output_len)
    rng = np.random.default_rng(seed)
    r_in, r_out = _ratio(range_ratio, "input"), _ratio(range_ratio, "output")
    in_low, in_high = max(1, math.floor(input_len * (1 - r_in))), math.ceil(input_len * (1 + r_in))
    out_low, out_high = max(1, math.floor(output_len * (1 - r_out))), math.ceil(output_len * (1 + r_out))
    inputs = rng.integers(in_low, in_high + 1, size=num_requests)
    outputs = rng.integers(out_low, out_high + 1, size=num_requests)
    return [RequestSpec(input_len=int(i), output_len=int(o)) for i, o in zip(inputs, outputs, strict=True)]


@dataclass(frozen=True)
class LognormalFit:
    """A bivariate lognormal: means and covariance of (log input_len, log output_len)."""

    mean: tuple[float, float]
    cov: tuple[tuple[float, float], tuple[float, float]]

    @classmethod
    def from_specs(cls, specs: Sequence[RequestSpec]) -> LognormalFit:
        logs = np.log(np.array([[max(s.input_len, 1), max(s.output_len, 1)] for s in specs], dtype=np.float64))
        if len(logs) < 2:
            raise ValueError("fitting a lognormal needs at least two requests")
        mean = logs.mean(axis=0)
        cov = np.cov(logs, rowvar=False)
        return cls((float(mean[0]), float(mean[1])), ((cov[0, 0], cov[0, 1]), (cov[1, 0], cov[1, 1])))

    def median(self) -> tuple[float, float]:
        return math.exp(self.mean[0]), math.exp(self.mean[1])

    def sample(self, num_requests: int, seed: int = 0, max_len: int | None = None) -> list[RequestSpec]:
        rng = np.random.default_rng(seed)
        logs = rng.multivariate_normal(self.mean, self.cov, size=num_requests)
        lengths = np.maximum(np.rint(np.exp(logs)), 1).astype(np.int64)
        if max_len is not None:
            lengths = np.minimum(lengths, max_len)
        return [RequestSpec(input_len=int(i), output_len=int(o)) for i, o in lengths]


def lognormal(
    num_requests: int, fit_to: Sequence[RequestSpec], seed: int = 0, max_len: int | None = None
) -> list[RequestSpec]:
    """Lognormal fitted to a trace (log-space means and covariance, so input/output correlation survives).
    A smooth fit loses spikes such as the Azure code 7.4k cap: use the mix itself when those matter."""
    return LognormalFit.from_specs(fit_to).sample(num_requests, seed, max_len)


def mixture(
    components: Sequence[tuple[Sequence[RequestSpec], float]],
    num_requests: int,
    seed: int = 0,
    names: Sequence[str] | None = None,
) -> list[RequestSpec]:
    """Each request drawn from one component (chosen by weight), then uniformly within it; timestamps dropped.
    A request keeps its own class; one without takes its component's name from `names`, if given."""
    if not components:
        raise ValueError("a mixture needs at least one component")
    weights = np.array([weight for _, weight in components], dtype=np.float64)
    if np.any(weights < 0) or weights.sum() <= 0:
        raise ValueError(f"mixture weights must be >= 0 with a positive sum, got {weights.tolist()}")
    if any(len(specs) == 0 for specs, _ in components):
        raise ValueError("a mixture component is empty")
    rng = np.random.default_rng(seed)
    choices = rng.choice(len(components), size=num_requests, p=weights / weights.sum())
    result = []
    for component in choices:
        specs = components[component][0]
        spec = specs[int(rng.integers(len(specs)))]
        request_class = spec.request_class or (names[component] if names is not None else None)
        result.append(RequestSpec(input_len=spec.input_len, output_len=spec.output_len, schema=spec.schema,
                                  request_class=request_class))  # fmt: skip
    return result
