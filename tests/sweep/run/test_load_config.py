"""`LoadConfig`: the load, workload and SLO checks `bench sweep` and `bench simulate` share."""

from __future__ import annotations

from pathlib import Path

import pytest

from sweep.run.load_config import LoadConfig
from sweep.run.sweep_config import SweepConfig
from workloads.replay import replay_label


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"mode": "replay"}, "mode must be 'concurrency' or 'rate'"),
        ({"values": []}, "at least one load"),
        ({"values": [1.5]}, "positive integers"),
        ({"mode": "rate", "values": [0.0]}, "must be > 0"),
        ({"max_load_under_slo": True}, "needs an --slo"),
        ({"percentiles": [0.0]}, "percentiles must be in"),
    ],
)
def test_bad_loads_fail_on_construction(fields: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LoadConfig(**fields)


def test_a_subclass_adds_modes_and_keeps_its_positional_fields(tmp_path: Path) -> None:
    config = SweepConfig(tmp_path, mode="replay", values=[0.5])
    assert config.output_dir == tmp_path and config.num_prompts == 200
    assert config.label(0.5) == replay_label(0.5) and LoadConfig().label(4) == "c0004"
    with pytest.raises(ValueError, match="'concurrency', 'rate' or 'replay'"):
        SweepConfig(tmp_path, mode="ramp")
    assert LoadConfig(duration=5.0).num_prompts is None
    assert SweepConfig(tmp_path).load_fields() == LoadConfig().load_fields()
