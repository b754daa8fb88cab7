"""Checkable claims in README.md and docs/: each test pins one claim to the code it describes."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
import typer

from sweep.run.cost import CostConfig, cost_fields
from sweep.tune.space import engine_knobs

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "benchmarks-history.md")]
COMMAND_MODULES = [
    "sweep.commands",
    "sweep.tune.commands",
    "sweep.simulate.commands",
    "reports.commands",
    "engine.commands",
    "workloads.commands",
]


def _registered(module_name: str) -> list[str]:
    """The visible command names `module.register` adds, top level and in the groups."""
    module = importlib.import_module(module_name)
    app = typer.Typer()
    groups = {name: typer.Typer() for name in ("model", "check", "lab")}
    if module_name == "workloads.commands":
        module.register(app)
    else:
        module.register(app, groups)
    names = [c.name for c in app.registered_commands if not c.hidden]
    names += [g.name for g in app.registered_groups]
    for group in groups.values():
        names += [c.name for c in group.registered_commands if not c.hidden]
    return [n for n in names if n]


@pytest.mark.parametrize("module_name", COMMAND_MODULES)
def test_module_docstring_names_every_command_it_registers(module_name: str) -> None:
    doc = importlib.import_module(module_name).__doc__ or ""
    named = [name for name in _registered(module_name) if re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", doc)]
    missing = sorted(set(_registered(module_name)) - set(named))
    assert not missing, f"{module_name}'s docstring does not name {missing}"


def test_tune_md_lists_every_default_search_knob() -> None:
    text = (ROOT / "docs" / "TUNE.md").read_text()
    section = text.split("## Search space", 1)[1].split("\n## ", 1)[0]
    searched = [name for name, spec in engine_knobs().items() if spec.search is not None]
    assert "tensor_parallel_size" in searched
    phrases = {"enable_chunked_prefill": "chunked prefill", "enable_prefix_caching": "prefix caching"}
    missing = [n for n in searched if phrases.get(n, n).split(".")[-1] not in section]
    assert not missing, f"docs/TUNE.md's search-space section omits {missing}"


def test_tune_md_max_model_len_floor_for_every_workload() -> None:
    section = (ROOT / "docs" / "TUNE.md").read_text().split("## Search space", 1)[1].split("\n## ", 1)[0]
    assert "never below the workload's longest request" in section  # tests/sweep/tune/test_sound_answers.py
    assert "shipped mixes and traces are not checked" not in section


def test_no_doc_claims_fp8_is_implemented() -> None:
    for path in DOCS:
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if "fp8" in line and "`fp8`" in line or "fp8 on a" in line:
                assert "no device" in line or "refuse" in line, f"{path.name}:{number}: {line}"


def test_docs_do_not_claim_untested_servers_are_driven() -> None:
    for name in ("README.md", "docs/SWEEP.md"):
        text = (ROOT / name).read_text()
        assert "SGLang" not in text, name
        assert "tested against" in text, name


def test_gpus_per_instance_enters_the_cost_of_a_configuration_on_gpus() -> None:
    one, eight = (cost_fields([], 10.0, None, CostConfig(2.0, gpus_per_instance=g), devices_used=1) for g in (1, 8))
    assert one["configuration_cost_per_hour"] == 8 * eight["configuration_cost_per_hour"] == 2.0
    assert "devices_used / N" in (ROOT / "docs" / "TUNE.md").read_text()
    for name in ("docs/SWEEP.md", "docs/SIMULATE.md"):
        text = (ROOT / name).read_text()
        assert "--gpus-per-instance N` is" not in text and "enters no figure" not in text, name
