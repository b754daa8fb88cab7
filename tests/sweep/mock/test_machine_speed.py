"""The machine-speed check's host figures and the busy/slow warnings built from them."""

from __future__ import annotations

from sweep.mock import machine_speed
from sweep.mock.machine_speed import BUSY_CORES, SLOW_MATMUL_GFLOPS, host_load, host_warnings


def test_host_load_reports_cores_load_and_busy_cores() -> None:
    host = host_load(sample_s=0.05)
    assert host["cpu_count"] >= 1
    assert host["load_average_1m"] is not None and host["load_average_1m"] >= 0
    assert host["busy_cores"] is not None and 0 <= host["busy_cores"] <= host["cpu_count"]


def test_busy_cores_from_proc_stat_deltas(monkeypatch) -> None:
    samples = iter([(1000, 10000), (1150, 10200)])  # 150 of 200 jiffies busy: 0.75 of all cores
    monkeypatch.setattr(machine_speed, "_cpu_jiffies", lambda: next(samples))
    monkeypatch.setattr(machine_speed.os, "cpu_count", lambda: 2)
    assert host_load(sample_s=0)["busy_cores"] == 1.5


def test_no_warning_on_an_idle_normal_host() -> None:
    calibration = {"host": {"busy_cores": 0.05, "cpu_count": 2, "load_average_1m": 0.1},
                   "speed": {"cpu_matmul_gflops": 250.0}}
    assert host_warnings(calibration) == []
    assert host_warnings(None) == [] and host_warnings({"speed": {}}) == []


def test_busy_and_slow_hosts_are_named() -> None:
    calibration = {"host": {"busy_cores": BUSY_CORES + 0.5, "cpu_count": 2, "load_average_1m": 2.3},
                   "speed": {"cpu_matmul_gflops": SLOW_MATMUL_GFLOPS - 10}}
    busy, slow = host_warnings(calibration)
    assert busy.startswith("host busy") and "1.00 of 2 cores" in busy and "2.3" in busy
    assert slow.startswith("host slow") and "90 GFLOP/s" in slow
