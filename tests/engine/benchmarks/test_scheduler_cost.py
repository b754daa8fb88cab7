"""python -m engine.benchmarks.scheduler_cost: its argument handling and one tiny measurement."""

from __future__ import annotations

import pytest

from engine.benchmarks.scheduler_cost import main, steady_decode_cpu_us


@pytest.mark.parametrize(("argument", "message"), [("abc", "not an integer: 'abc'"), ("0", "must be >= 1")])
def test_a_bad_argument_is_a_usage_error_not_a_traceback(
    argument: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([argument])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_prints_one_line_per_number_of_running_sequences(capsys: pytest.CaptureFixture[str]) -> None:
    main(["1", "3"])
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == ["1", "3"] and all("us/step" in line for line in lines)


def test_measures_a_positive_cpu_time() -> None:
    assert steady_decode_cpu_us(2, steps=5, warmup_steps=2) > 0
