import pytest

from workloads.fit import fit_to_model
from workloads.spec import RequestSpec

SPECS = [RequestSpec(100, 20), RequestSpec(900, 300), RequestSpec(1500, 10), RequestSpec(600, 600)]


def test_clip_caps_input_then_output_and_counts_changes():
    fitted, report = fit_to_model(SPECS, 1000, "clip")
    assert [(s.input_len, s.output_len) for s in fitted] == [(100, 20), (900, 100), (999, 1), (600, 400)]
    assert (report.changed, report.dropped, report.kept, report.total) == (3, 0, 4, 4)
    assert (report.input_changed, report.output_changed) == (1, 3)
    assert "3 changed" in report.summary()


def test_drop_removes_only_requests_over_the_limit():
    fitted, report = fit_to_model(SPECS, 1000, "drop")
    assert fitted == [SPECS[0]] and report.dropped == 3 and report.changed == 0


def test_rescale_keeps_the_input_output_ratio():
    fitted, report = fit_to_model(SPECS, 1000, "rescale")
    assert fitted[0] is SPECS[0] and report.changed == 3
    assert all(s.input_len + s.output_len <= 1000 for s in fitted)
    assert fitted[3].input_len == fitted[3].output_len == 500
    assert fitted[1].input_len / fitted[1].output_len == pytest.approx(3.0, rel=0.01)


def test_prefix_ids_are_trimmed_with_the_input():
    spec = RequestSpec(2000, 10, prefix_ids=[1, 2, 3, 4], prefix_block_size=512)
    (fitted,), _ = fit_to_model([spec], 1100, "clip")
    assert fitted.input_len == 1099 and fitted.prefix_ids == [1, 2, 3]


def test_source_counts_are_never_touched_in_place():
    before = [RequestSpec(s.input_len, s.output_len) for s in SPECS]
    fit_to_model(SPECS, 1000, "clip")
    assert SPECS == before


def test_bad_policy_or_length():
    with pytest.raises(ValueError, match="fit_policy must be one of"):
        fit_to_model(SPECS, 1000, "squash")
    with pytest.raises(ValueError, match="max_model_len must be >= 2"):
        fit_to_model(SPECS, 1, "clip")
