"""`bench compare-llama-cpp`'s bookkeeping with fake servers and sweeps: targets interleaved round by round, each
started and stopped around its own sweep, medians over the rounds, ratios to llama.cpp at the same concurrency.
(The real servers run in tests/sweep/test_llama_cpp_server.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sweep import compare_llama_cpp as cmp

TPOT = {"int4": 20.0, "llama.cpp": 10.0}


class FakeServer:
    def __init__(self, target: str, events: list[str]) -> None:
        self.target, self.events, self.url = target, events, f"http://{target}/v1"

    def stop(self) -> None:
        self.events.append(f"stop {self.target}")


def test_targets_interleave_and_ratios_are_to_llama_cpp(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    events: list[str] = []
    calls = {"n": 0}

    def start(target: str, *args: Any) -> FakeServer:
        events.append(f"start {target}")
        return FakeServer(target, events)

    def sweep(url: str, model: str, concurrency: list[int], *args: Any) -> list[dict[str, Any]]:
        target = url.split("/")[2]
        calls["n"] += 1
        jitter = calls["n"] // 2 % 2  # rounds differ: the median is reported
        return [{"max_concurrency": c, "median_tpot_ms": TPOT[target] * c + jitter, "completed": 4,
                 "output_throughput": 1000 / TPOT[target], "total_output_tokens": 4 * 128} for c in concurrency]

    monkeypatch.setattr(cmp, "start_target", start)
    monkeypatch.setattr(cmp, "run_sweep", sweep)
    results = cmp.compare("smollm2-135m", Path("x.gguf"), ["int4"], [1, 16], 4, 256, 128, 2, None, tmp_path,
                          echo=lambda _: None)
    assert events == ["start int4", "stop int4", "start llama.cpp", "stop llama.cpp"] * 2
    assert [(p.target, p.concurrency) for p in results] == [("int4", 1), ("llama.cpp", 1), ("int4", 16),
                                                            ("llama.cpp", 16)]
    int4 = results[0]
    assert int4.median_tpot_ms == 20.5 and int4.tpot_ratio == pytest.approx(20.5 / 10.5)
    assert int4.throughput_ratio == pytest.approx(0.5) and int4.mean_output_tokens == 128
    table = cmp.format_table(results)
    assert "| bench serve --quantization int4 | 16 |" in table and "| llama.cpp (Q4_1 GGUF) | 1 | 10.5 | 1.00x" in table
