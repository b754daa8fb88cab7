import pytest

from workloads import arrivals
from workloads.fidelity import fidelity
from workloads.spec import RequestSpec


def test_identical_and_disjoint_lengths():
    specs = [RequestSpec(i, 2 * i) for i in range(1, 101)]
    same = fidelity(specs, [s.input_len for s in specs], [s.output_len for s in specs])
    assert same["input_ks"] == 0 and same["output_ks"] == 0 and same["input_exact_fraction"] == 1.0
    off = fidelity(specs, [s.input_len + 1000 for s in specs], [s.output_len // 2 for s in specs])
    assert off["input_ks"] == 1.0 and 0 < off["output_ks"] < 1 and off["input_exact_fraction"] == 0.0


def test_offered_vs_achieved_rate_and_lag():
    specs = [RequestSpec(10, 10)] * 2000
    intended = arrivals.poisson(10.0, 2000, seed=0)
    actual = [t * 1.25 + 0.01 for t in intended]  # a client that fell behind
    result = fidelity(specs, [10] * 2000, [10] * 2000, intended, actual)
    assert result["offered_rate_rps"] == pytest.approx(10.0, rel=0.05)
    assert result["rate_ratio"] == pytest.approx(0.8)
    assert result["offered_iat_cv"] == pytest.approx(1.0, rel=0.05)
    assert result["achieved_iat_cv"] == pytest.approx(result["offered_iat_cv"])
    assert result["send_lag_max_s"] == pytest.approx(intended[-1] * 0.25 + 0.01)


def test_mismatched_lengths_are_an_error():
    with pytest.raises(ValueError, match="one realised length per request"):
        fidelity([RequestSpec(1, 1)], [1, 2], [1])
