import numpy as np
import pytest

from workloads import arrivals


def gaps(offsets):
    return np.diff(np.asarray(offsets))


def test_poisson_reproduces_rate_and_cv():
    offsets = arrivals.poisson(rate=8.0, num_requests=20000, seed=1)
    assert offsets[0] == 0.0 and np.all(gaps(offsets) >= 0)
    assert (len(offsets) - 1) / offsets[-1] == pytest.approx(8.0, rel=0.03)
    assert gaps(offsets).std() / gaps(offsets).mean() == pytest.approx(1.0, rel=0.03)
    assert offsets == arrivals.poisson(8.0, 20000, seed=1) and offsets != arrivals.poisson(8.0, 20000, seed=2)


@pytest.mark.parametrize("burstiness", [0.25, 0.5, 4.0])
def test_gamma_cv_is_one_over_sqrt_burstiness(burstiness):
    offsets = arrivals.gamma(rate=3.0, burstiness=burstiness, num_requests=20000, seed=2)
    g = gaps(offsets)
    assert (len(offsets) - 1) / offsets[-1] == pytest.approx(3.0, rel=0.05)
    assert g.std() / g.mean() == pytest.approx(1 / np.sqrt(burstiness), rel=0.05)


def test_constant_and_closed_loop():
    assert arrivals.constant(4.0, 3) == [0.0, 0.25, 0.5]
    assert arrivals.closed_loop(3) == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("kind", ["linear", "exponential"])
def test_ramp_follows_the_rate_curve_from_start_to_end(kind):
    n, start, end = 40000, 1.0, 16.0
    g = gaps(arrivals.ramp(start_rate=start, end_rate=end, num_requests=n, kind=kind, seed=3))
    progress = np.arange(1, n) / (n - 1)
    rate = start + (end - start) * progress if kind == "linear" else start * (end / start) ** progress
    for window in (slice(0, 2000), slice(n // 2 - 1000, n // 2 + 1000), slice(n - 2001, n - 1)):
        assert g[window].mean() == pytest.approx((1 / rate[window]).mean(), rel=0.06)
    assert 1 / g[:400].mean() == pytest.approx(start, rel=0.15)
    assert 1 / g[-400:].mean() == pytest.approx(end, rel=0.15)


def test_replay_preserves_order_and_scales_gaps():
    stamps = [10.0, 10.5, 12.0, 12.0, 20.0]
    assert arrivals.replay(stamps) == [0.0, 0.5, 2.0, 2.0, 10.0]
    assert arrivals.replay(stamps, time_scale=2.0) == [0.0, 1.0, 4.0, 4.0, 20.0]
    assert arrivals.replay(stamps, time_scale=0.5) == [0.0, 0.25, 1.0, 1.0, 5.0]


def test_replay_spreads_quantized_ticks_in_order():
    stamps = [0.0] * 3 + [3.0] * 2 + [5.0] * 4
    spread = arrivals.replay(stamps, tick_s=3.0)
    assert spread == sorted(spread)
    assert spread[:3] == [0.0, 1.0, 2.0] and spread[3:5] == [3.0, 4.0]
    assert spread[5:] == [5.0, 5.75, 6.5, 7.25]
    assert arrivals.replay(stamps, time_scale=2.0, tick_s=3.0)[1] == 2.0


def test_rate_curve_follows_the_shape_and_skips_zero_windows():
    offsets = np.array(arrivals.rate_curve([1.0, 0.0, 3.0], num_requests=20000, mean_rate=10.0, seed=4))
    assert np.all(np.diff(offsets) >= 0) and offsets[-1] == pytest.approx(2000, rel=0.02)
    window = 2000 / 3
    counts = np.histogram(offsets, bins=[0, window, 2 * window, 3 * window + 50])[0]
    assert counts[1] == 0
    assert counts[0] / counts[2] == pytest.approx(1 / 3, rel=0.05)
    repeated = np.array(arrivals.rate_curve([1.0, 3.0], 20000, 10.0, duration_s=500, seed=4))
    first_halves = np.sum((repeated % 500) < 250)
    assert first_halves / len(repeated) == pytest.approx(0.25, abs=0.01)
    bursty = np.diff(arrivals.rate_curve([1.0], 20000, 10.0, burstiness=0.25, seed=4))
    assert bursty.std() / bursty.mean() == pytest.approx(2.0, rel=0.05)


def test_invalid_arguments():
    with pytest.raises(ValueError, match="rate"):
        arrivals.poisson(0.0, 5)
    with pytest.raises(ValueError, match="burstiness"):
        arrivals.gamma(1.0, 0.0, 5)
    with pytest.raises(ValueError, match="ramp kind"):
        arrivals.ramp(1.0, 2.0, 5, kind="cubic")
    with pytest.raises(ValueError, match="request 2 goes back in time"):
        arrivals.replay([0.0, 2.0, 1.0])
