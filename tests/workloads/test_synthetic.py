import numpy as np
import pytest

import workloads
from workloads import synthetic
from workloads.mixes import load_mix
from workloads.stats import correlation


def test_fixed_is_the_512_128_baseline():
    specs = workloads.load("fixed", num_requests=5)
    assert {(s.input_len, s.output_len) for s in specs} == {(512, 128)} and len(specs) == 5


def test_random_uses_vllm_symmetric_range_ratio():
    specs = synthetic.random_lengths(20000, input_len=100, output_len=10, range_ratio=0.5, seed=0)
    inputs, outputs = np.array([s.input_len for s in specs]), np.array([s.output_len for s in specs])
    assert (inputs.min(), inputs.max()) == (50, 150) and (outputs.min(), outputs.max()) == (5, 15)
    assert inputs.mean() == pytest.approx(100, rel=0.01)
    specs = synthetic.random_lengths(1000, 100, 10, {"input": 0.0, "output": 0.9}, seed=0)
    assert {s.input_len for s in specs} == {100} and min(s.output_len for s in specs) == 1
    assert synthetic.random_lengths(5, 100, 10, 0.0) == synthetic.fixed(5, 100, 10)
    with pytest.raises(ValueError, match=r"range_ratio must be in \[0, 1\)"):
        synthetic.random_lengths(5, 100, 10, 1.0)


def test_lognormal_fit_keeps_medians_and_correlation():
    source = load_mix("bwb-translation")
    specs = workloads.load("lognormal", num_requests=20000, fit_to="bwb-translation", seed=1)
    for attribute in ("input_len", "output_len"):
        ours = np.median([getattr(s, attribute) for s in specs])
        theirs = np.median([getattr(s, attribute) for s in source])
        assert ours == pytest.approx(theirs, rel=0.05)
    assert correlation([s.input_len for s in specs], [s.output_len for s in specs])["pearson_log1p"] > 0.8


def test_mixture_follows_weights():
    specs = workloads.load("mixture:fixed=3,random=1", num_requests=8000, seed=0)
    fixed_share = np.mean([s.input_len == 512 and s.output_len == 128 for s in specs])
    assert fixed_share == pytest.approx(0.75, abs=0.02)
    with pytest.raises(ValueError, match="weights"):
        synthetic.mixture([(synthetic.fixed(1), -1.0)], 3)
