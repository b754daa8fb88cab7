"""Derivation against the raw traces and the source summary in ../shared/workloads (present in CI)."""

import gzip
import json
from pathlib import Path

import pytest

from workloads.derive import MIX_SOURCES, _hash_id_runs, derive_all, find_raw_file
from workloads.mixes import DATA_DIR, _expand_runs, metadata

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "workloads"
SUMMARY_KEYS = {
    "azure-code-2023": "azure_2023_code",
    "azure-conv-2023": "azure_2023_conv",
    "mooncake-conversation": "mooncake_conversation",
    "sharegpt": "sharegpt_8k_llama2",
    "arxiv-summarization": "arxiv_summarization_llama2",
    "bwb-translation": "bwb_translation_llama2",
    "lmsys": "lmsys_chat_1m_sample1024_llama",
}


def test_hash_id_runs_round_trip():
    for ids in ([], [0], [0, 1, 2, 3], [0, 59, 60, 61, 7, 8, 100], [5, 5, 6]):
        assert _expand_runs(_hash_id_runs(ids)) == ids
    assert _hash_id_runs([0, 14, 15, 16]) == [0, 1, 14, 3]


@pytest.mark.parametrize("name", sorted(SUMMARY_KEYS))
def test_shipped_statistics_match_the_source_summary(name):
    summary = json.loads((SHARED / "summary.json").read_text())["traces"][SUMMARY_KEYS[name]]
    meta = metadata(name)
    assert meta["rows"] == summary["rows"]
    for ours, theirs in (("input_len", "input_tokens"), ("output_len", "output_tokens")):
        for key, expected in summary[theirs].items():
            if key in meta["source_percentiles"][ours]:
                assert meta["source_percentiles"][ours][key] == pytest.approx(expected, rel=0.01), (ours, key)
    assert meta["correlation"]["pearson"] == pytest.approx(summary["input_output_correlation"]["pearson"], abs=1e-3)
    if summary.get("arrivals"):
        assert meta["arrivals"]["mean_rate_rps"] == pytest.approx(summary["arrivals"]["mean_rate_rps"], rel=1e-3)
        assert meta["arrivals"]["iat_cv"] == pytest.approx(summary["arrivals"]["iat_cv"], rel=1e-3)
    if summary.get("prefix_reuse"):
        for key, value in meta["prefix"].items():
            assert value == summary["prefix_reuse"][key], key


def test_servegen_statistics_match_the_source_summary():
    summary = json.loads((SHARED / "summary.json").read_text())["traces"]["servegen_reason_deepseek-r1"]
    meta = metadata("servegen-deepseek-r1")
    for ours, theirs in (("input_len", "input_tokens"), ("output_len", "output_tokens")):
        for key, value in meta["source_percentiles"][ours].items():
            assert value == pytest.approx(summary["lengths"][theirs][key], rel=1e-4), (ours, key)
    assert meta["arrivals"]["mean_rate_rps"] == summary["aggregate_rate_rps"]["mean"]
    assert len(meta["arrivals"]["aggregate_rate_rps"]) == 144
    assert meta["arrivals"]["volume_weighted_mean_client_iat_cv"] == summary["volume_weighted_mean_client_iat_cv"]


def test_derivation_reproduces_the_shipped_bytes(tmp_path):
    names = ["azure-code-2023", "lmsys"]
    written = derive_all(SHARED / "raw", tmp_path, names)
    assert [path.name for path in written] == [f"{name}.json.gz" for name in names]
    for path in written:
        assert path.read_bytes() == (DATA_DIR / path.name).read_bytes(), path.name
    document = json.loads(gzip.decompress(written[1].read_bytes()))
    assert document["columns"]["input_len"][:2] == [156, 115]  # the raw file's first rows


def test_every_source_file_is_found_under_the_raw_dir():
    for source in MIX_SOURCES:
        assert find_raw_file(SHARED / "raw", source.file_name) is not None, source.file_name
