"""The step-time cost model: step shapes, the non-negative fit, the JSON form."""

from __future__ import annotations

import numpy as np
import pytest

from engine.executor.cost_model import CostModel, StepShape, features, fit, nnls
from engine.request import Request
from engine.sampling_params import SamplingParams
from engine.scheduler_output import ScheduledRequest, SchedulerOutput


def scheduled(context: int, query: int) -> ScheduledRequest:
    request = Request("r", list(range(context + query)), SamplingParams(), max_tokens=4)
    request.num_computed_tokens = context
    return ScheduledRequest(request, query, [], sample=True)


def test_step_shape_counts_decodes_prefill_tokens_context_and_attention_pairs() -> None:
    output = SchedulerOutput([scheduled(10, 1), scheduled(30, 1), scheduled(0, 8), scheduled(16, 4)])
    shape = StepShape.of(output)
    assert (shape.num_decode_seqs, shape.decode_context_tokens) == (2, 11 + 31)
    assert (shape.num_prefill_seqs, shape.num_prefill_tokens) == (2, 12)
    # 8 fresh tokens attend over 1..8 keys (36 pairs); 4 tokens over 17..20 keys (74 pairs)
    assert shape.prefill_attention_kpairs == pytest.approx((36 + 74) / 1000)
    assert (shape.num_tokens, shape.num_seqs) == (14, 4)


def test_step_time_is_the_linear_model_of_the_hand_computed_features() -> None:
    model = CostModel(
        {"overhead": 0.002, "tokens": 1e-4, "tokens_below_16": 5e-4, "tokens_above_128": 2e-4, "seqs": 1e-5,
         "decode_context_tokens": 1e-7},
        breakpoints=(16, 128),
    )  # fmt: skip
    shape = StepShape(num_prefill_tokens=199, num_decode_seqs=1, decode_context_tokens=500, num_prefill_seqs=1)
    expected = 0.002 + 200 * 1e-4 + 16 * 5e-4 + (200 - 128) * 2e-4 + 2 * 1e-5 + 500 * 1e-7
    assert model.step_time(shape) == pytest.approx(expected)


def test_nnls_keeps_coefficients_non_negative() -> None:
    a = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    b = np.array([2.0, -1.0, 1.0])  # unconstrained: x = (2, -1); with x >= 0 the best is (1.5, 0)
    assert nnls(a, b) == pytest.approx([1.5, 0.0])


def test_fit_recovers_a_known_model_and_reports_its_error() -> None:
    coefficients = {"overhead": 0.003, "tokens": 2e-5, "tokens_below_128": 1e-4, "seqs": 4e-5}
    truth = CostModel({**coefficients, "decode_context_tokens": 3e-8, "prefill_attention_kpairs": 1e-6}, (128,))
    shapes = [StepShape(num_prefill_tokens=p, num_prefill_seqs=1, prefill_attention_kpairs=p * p / 2000) for p in
              (8, 64, 256, 1024)]  # fmt: skip
    shapes += [StepShape(num_decode_seqs=d, decode_context_tokens=d * c) for d in (1, 8, 64) for c in (100, 1000)]
    shapes += [StepShape(num_prefill_tokens=256, num_prefill_seqs=1, num_decode_seqs=8, decode_context_tokens=4000)]
    times = [truth.step_time(s) for s in shapes]
    model = fit(shapes, times, breakpoints=(128, 4096))
    assert model.breakpoints == (128,)  # a breakpoint above every profiled step is dropped
    assert [model.step_time(s) for s in shapes] == pytest.approx(times, rel=1e-6)
    assert model.fit_error["max_rel_error"] < 1e-6 and "loo_mean_rel_error" in model.fit_error
    assert CostModel.from_json(__import__("json").dumps(model.to_dict())).step_time(shapes[3]) == pytest.approx(
        times[3]
    )
    assert features(shapes[0], (128,)).shape == (len(model.coefficients),)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({}, "not a cost model"),
        ({"coefficients": {"overhead": -1.0}}, ">= 0"),
        ({"coefficients": {"warp_speed": 1.0}}, "unknown coefficient"),
        ({"coefficients": {"overhead": 1.0}, "serving": {"per_token_http": 1.0}}, "unknown coefficient"),
        ({"coefficients": {"overhead": 1.0}, "serving": {"per_seq": -1.0}}, ">= 0"),
    ],
)
def test_a_bad_cost_model_is_rejected(data: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CostModel.from_dict(data)


def test_fit_rejects_mismatched_or_non_positive_times() -> None:
    with pytest.raises(ValueError, match="as many"):
        fit([StepShape(num_decode_seqs=1)], [])
    with pytest.raises(ValueError, match="> 0"):
        fit([StepShape(num_decode_seqs=1)], [0.0])


def test_serving_terms_add_a_per_step_and_a_per_sequence_cost() -> None:
    base = CostModel({"overhead": 0.010, "tokens": 0.001})
    served = CostModel.from_dict({**base.to_dict(), "serving": {"step_overhead": 0.002, "per_seq": 0.0005}})
    shape = StepShape(num_prefill_tokens=30, num_prefill_seqs=1, num_decode_seqs=3, decode_context_tokens=90)
    assert base.step_time(shape) == pytest.approx(0.010 + 0.033)
    assert served.step_time(shape) == pytest.approx(0.010 + 0.033 + 0.002 + 4 * 0.0005)
