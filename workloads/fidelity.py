"""How faithfully a run delivered its workload: requested vs realised lengths and offered vs achieved arrivals."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from workloads.spec import RequestSpec
from workloads.stats import coefficient_of_variation, ks_statistic


def _rate(times: np.ndarray) -> float | None:
    span = float(times.max() - times.min()) if times.size > 1 else 0.0
    return (times.size - 1) / span if span > 0 else None


def _arrivals(times: np.ndarray) -> dict:
    gaps = np.diff(np.sort(times))
    return {
        "rate_rps": _rate(times),
        "iat_cv": coefficient_of_variation(gaps) if gaps.size > 1 else None,
    }


def fidelity(
    requested: Sequence[RequestSpec],
    realised_input: Sequence[int],
    realised_output: Sequence[int],
    intended_send_times: Sequence[float] | None = None,
    actual_send_times: Sequence[float] | None = None,
) -> dict:
    """KS statistics (0 = identical distributions) and exact-match fractions for input and output lengths, and,
    with send times (both in seconds from the run start), offered vs achieved rate, inter-arrival CVs and the
    schedule lag (actual - intended)."""
    if not (len(requested) == len(realised_input) == len(realised_output)):
        raise ValueError(
            f"fidelity needs one realised length per request: {len(requested)} requested, "
            f"{len(realised_input)} realised inputs, {len(realised_output)} realised outputs"
        )
    if not requested:
        raise ValueError("fidelity of an empty run")
    want_in = np.array([spec.input_len for spec in requested])
    want_out = np.array([spec.output_len for spec in requested])
    got_in, got_out = np.asarray(realised_input), np.asarray(realised_output)
    result: dict = {
        "num_requests": len(requested),
        "input_ks": ks_statistic(want_in, got_in),
        "output_ks": ks_statistic(want_out, got_out),
        "input_exact_fraction": float(np.mean(want_in == got_in)),
        "output_exact_fraction": float(np.mean(want_out == got_out)),
        "input_mean_requested": float(want_in.mean()),
        "input_mean_realised": float(got_in.mean()),
        "output_mean_requested": float(want_out.mean()),
        "output_mean_realised": float(got_out.mean()),
    }
    if intended_send_times is not None and actual_send_times is not None:
        intended, actual = np.asarray(intended_send_times, float), np.asarray(actual_send_times, float)
        if intended.shape != actual.shape or intended.size != len(requested):
            raise ValueError("intended and actual send times need one entry per request")
        offered, achieved = _arrivals(intended), _arrivals(actual)
        lag = actual - intended
        result.update(
            offered_rate_rps=offered["rate_rps"],
            achieved_rate_rps=achieved["rate_rps"],
            rate_ratio=achieved["rate_rps"] / offered["rate_rps"]
            if offered["rate_rps"] and achieved["rate_rps"]
            else None,
            offered_iat_cv=offered["iat_cv"],
            achieved_iat_cv=achieved["iat_cv"],
            send_lag_mean_s=float(lag.mean()),
            send_lag_p99_s=float(np.percentile(lag, 99)),
            send_lag_max_s=float(lag.max()),
        )
    return result


def compare_lengths(specs: Sequence[RequestSpec], reference: Sequence[RequestSpec]) -> dict:
    """How a workload's lengths (e.g. a prompt file's, measured with the target's tokenizer) compare with a reference
    mix's: each side's percentiles and the two-sample KS statistic (0 = identical distributions) per length."""
    from workloads.stats import percentiles

    if not specs or not reference:
        raise ValueError("compare_lengths needs two non-empty workloads")
    result: dict = {}
    for key in ("input_len", "output_len"):
        mine = [getattr(spec, key) for spec in specs]
        theirs = [getattr(spec, key) for spec in reference]
        result[key] = {
            "workload": percentiles(mine),
            "reference": percentiles(theirs),
            "ks": ks_statistic(mine, theirs),
        }
    return result
