"""The engine's commands: the new spellings are listed, each old name is hidden and still runs, naming the new one."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from cli import app

OLD_NAMES = {
    "prepare-model": "bench model prepare",
    "gpu-check": "bench check gpu",
    "quality": "bench check quality",
    "decode-profile": "bench lab decode-profile",
    "omp-wait-policy": "bench lab omp-wait-policy",
    "structured-outputs": "bench lab structured-outputs",
    "throughput-tp": "bench throughput --vary tensor_parallel_size=1,2",
    "decode-speed": "bench throughput --vary dtype=float32,bfloat16 --vary quantization=none,int8,int4",
    "spec-decode": "bench throughput --vary num_speculative_tokens=0,2,4,6 --vary max_num_seqs=1,8",
}


def test_the_top_level_lists_only_the_new_names() -> None:
    listed = CliRunner().invoke(app, ["--help"]).output
    assert "│ throughput " in listed and "│ serve " in listed
    for old in OLD_NAMES:
        assert f"│ {old} " not in listed


@pytest.mark.parametrize(("group", "names"), [("model", ["prepare"]), ("check", ["gpu", "quality"]),
                                              ("lab", ["decode-profile", "omp-wait-policy", "structured-outputs"])])
def test_the_groups_list_the_engines_commands(group: str, names: list[str]) -> None:
    listed = CliRunner().invoke(app, [group, "--help"]).output
    assert all(f"│ {name} " in listed for name in names)


def test_an_old_name_runs_the_command_and_names_the_new_spelling() -> None:
    result = CliRunner().invoke(app, ["prepare-model", "tiny-random"])
    assert result.exit_code == 0, result.output
    assert "now `bench model prepare`" in result.output


@pytest.mark.parametrize(("old", "args"), [("throughput-tp", ["--tensor-parallel-size", "0"]),
                                           ("decode-speed", ["--settings", "float32"]),
                                           ("spec-decode", ["--num-speculative-tokens", "x"]),
                                           ("quality", ["--model", "tiny-random", "--window", "1"])])
def test_old_names_keep_their_options_and_print_the_new_spelling(old: str, args: list[str]) -> None:
    result = CliRunner().invoke(app, [old, *args])  # each a bad value: the old option is parsed, nothing runs
    assert result.exit_code != 0 and f"now `{OLD_NAMES[old]}" in result.output
