import numpy as np
import pytest

import workloads
from workloads.mixes import load_mix, metadata, shipped_names
from workloads.stats import arrival_stats, correlation, percentiles, prefix_reuse

REQUIRED = {
    "azure-code-2023",
    "azure-conv-2023",
    "mooncake-conversation",
    "sharegpt",
    "arxiv-summarization",
    "bwb-translation",
    "lmsys",
}


def test_required_mixes_are_shipped_with_provenance():
    assert REQUIRED <= set(shipped_names())
    for name in shipped_names():
        meta = metadata(name)
        for key in ("source", "licence", "attribution", "tokenizer", "rows", "derivation", "source_percentiles"):
            assert meta[key], (name, key)
        assert meta["source"]["repository"] and len(meta["source"]["commit"]) == 40


@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_mix_percentiles_match_the_source_within_one_percent(name):
    specs = workloads.load(name)
    meta = metadata(name)
    assert len(specs) == meta["rows"]
    for column, values in (("input_len", [s.input_len for s in specs]), ("output_len", [s.output_len for s in specs])):
        ours, source = percentiles(values), meta["source_percentiles"][column]
        for key, expected in source.items():
            assert ours[key] == pytest.approx(expected, rel=0.01, abs=0.5), (name, column, key)


def test_azure_code_keeps_its_input_cap_spike():
    inputs = np.array([s.input_len for s in load_mix("azure-code-2023")])
    assert 0.035 < np.mean((inputs >= 7435) & (inputs <= 7437)) < 0.04  # 3.7 % exactly at the 7,435-7,437 cap
    assert 0.045 < np.mean(inputs >= 7400) < 0.05  # 4.7 % within 40 tokens of it


def test_bwb_keeps_its_input_output_correlation():
    specs = load_mix("bwb-translation")
    assert correlation([s.input_len for s in specs], [s.output_len for s in specs])["pearson"] > 0.75


def test_timestamped_mixes_reproduce_their_arrival_statistics():
    for name in ("azure-code-2023", "azure-conv-2023"):
        specs = load_mix(name)
        times = [s.timestamp for s in specs]
        assert times[0] == 0.0 and all(b >= a for a, b in zip(times, times[1:], strict=False))
        stats, recorded = arrival_stats(times), metadata(name)["arrivals"]
        assert stats["mean_rate_rps"] == pytest.approx(recorded["mean_rate_rps"], rel=1e-3)
        assert stats["iat_cv"] == pytest.approx(recorded["iat_cv"], rel=1e-3)
    assert metadata("azure-code-2023")["arrivals"]["iat_cv"] > 10  # extremely bursty
    assert metadata("sharegpt")["arrivals"] is None


def test_mooncake_prefix_structure_survives():
    specs = load_mix("mooncake-conversation")
    recorded = metadata("mooncake-conversation")["prefix"]
    assert all(s.prefix_block_size == 512 and s.prefix_ids for s in specs)
    ours = prefix_reuse([s.prefix_ids for s in specs], [s.input_len for s in specs], 512)
    assert ours == recorded
    assert recorded["block_reuse_ratio_longest_cached_prefix"] == pytest.approx(0.366, abs=0.001)


def test_sampling_is_seeded_and_keeps_trace_order():
    first = workloads.load("azure-conv-2023", num_requests=200, seed=3)
    again = workloads.load("azure-conv-2023", num_requests=200, seed=3)
    other = workloads.load("azure-conv-2023", num_requests=200, seed=4)
    assert first == again and first != other and len(first) == 200
    times = [s.timestamp for s in first]
    assert times == sorted(times)
    oversampled = workloads.load("lmsys", num_requests=3000, seed=0)
    assert len(oversampled) == 3000


def test_load_without_model_keeps_counts_and_with_model_reports_the_fit():
    raw = workloads.load("mooncake-conversation")
    assert workloads.last_fit_report() is None
    assert max(s.input_len for s in raw) == 126195
    fitted = workloads.load("mooncake-conversation", max_model_len=8192, fit_policy="drop")
    report = workloads.last_fit_report()
    over = sum(s.input_len + s.output_len > 8192 for s in raw)
    assert report.dropped == over and len(fitted) == len(raw) - over and report.policy == "drop"
    assert all(s.input_len + s.output_len <= 8192 for s in fitted)


def test_list_workloads_and_errors():
    infos = {info.name: info for info in workloads.list_workloads()}
    assert infos["azure-code-2023"].input_p50 == 1469 and infos["azure-code-2023"].count == 8819
    assert infos["mooncake-conversation"].has_prefix_ids and not infos["sharegpt"].has_timestamps
    with pytest.raises(ValueError, match="unknown workload"):
        workloads.load("no-such-mix")
    with pytest.raises(ValueError, match="takes no length options"):
        workloads.load("sharegpt", input_len=10)
    with pytest.raises(ValueError, match="does not take option"):
        workloads.load("random", fit_to="sharegpt")


def test_servegen_quantile_table_matches_within_its_resolution():
    meta = metadata("servegen-deepseek-r1")
    assert "1/1000" in meta["resolution"] and meta["arrivals"]["window_s"] == 600
    table = workloads.load("servegen-deepseek-r1")
    assert len(table) == 1000
    for column in ("input_len", "output_len"):
        values = np.sort([getattr(s, column) for s in table])
        for q in (1, 10, 25, 50, 75, 90, 99):
            level = q * 10  # the table's grid is k/1000
            low, high = values[level - 2], values[level]  # one grid step either side
            assert low <= meta["source_percentiles"][column][f"p{q}"] <= high, (column, q)
    drawn = workloads.load("servegen-deepseek-r1", num_requests=20000, seed=5)
    assert drawn == workloads.load("servegen-deepseek-r1", num_requests=20000, seed=5)
    median = np.median([s.output_len for s in drawn])
    assert median == pytest.approx(meta["source_percentiles"]["output_len"]["p50"], rel=0.05)
    assert not workloads.mixes.info("servegen-deepseek-r1").has_timestamps
