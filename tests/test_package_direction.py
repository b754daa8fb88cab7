"""The packages depend one way: workloads <- sweep <- reports, and the engine on none of them.

Two checks per rule: every import statement in a package's source (lazy ones inside functions too), and what
importing every module of the package actually loads, in a fresh interpreter.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# package -> the top-level packages it must never import
FORBIDDEN = {
    "workloads": {"sweep", "reports", "engine"},
    "sweep": {"reports"},
    "engine": {"sweep", "reports", "workloads"},
}

def package_modules(package: str) -> list[str]:
    modules = []
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        modules.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return modules


def imported_packages(path: Path) -> set[str]:
    """Top-level packages named by every import statement in the file, wherever the statement sits."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def loaded_after_importing(modules: list[str]) -> set[str]:
    """Top-level packages in sys.modules after importing `modules` in a fresh interpreter."""
    script = (
        "import importlib, json, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps(sorted({key.split('.')[0] for key in sys.modules})))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.splitlines()[-1]))


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_source_file_imports_against_the_direction(package: str) -> None:
    violations = []
    for path in sorted((ROOT / package).rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        violations += [f"{relative} imports {name}" for name in sorted(imported_packages(path) & FORBIDDEN[package])]
    assert not violations, "\n".join(violations)


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_importing_every_module_loads_no_forbidden_package(package: str) -> None:
    loaded = loaded_after_importing(package_modules(package))
    assert package in loaded
    assert not loaded & FORBIDDEN[package]


def test_reports_and_the_gate_do_not_load_the_http_client() -> None:
    loaded = loaded_after_importing(package_modules("reports"))
    assert {"reports", "sweep"} <= loaded
    assert "aiohttp" not in loaded


def test_the_sweep_client_does_load_aiohttp() -> None:
    """The check above can see aiohttp: the HTTP client module, and only it among these, brings it in."""
    assert "aiohttp" in loaded_after_importing(["sweep.point.client"])
    assert "aiohttp" not in loaded_after_importing(["sweep", "sweep.point.records", "sweep.point.benchmark_metrics"])


# sweep's subpackages by job, bottom up: the client and one point; a run (sweeps, search, repeats, run directory),
# which times the machine with the mock's calibration (and the mock launches through the run's launcher); then the
# jobs built on runs (compare: several targets' runs, interleaved). A subpackage -> the sweep subpackages its
# modules may import (cli_options: command modules).
SWEEP_LAYERS = {
    "point": {"point"},
    "run": {"point", "run", "mock", "cli_options"},
    "mock": {"point", "run", "mock", "cli_options"},
    "soak": {"point", "run", "soak", "cli_options"},
    "simulate": {"point", "run", "simulate", "cli_options"},
    "tune": {"point", "run", "simulate", "tune", "cli_options"},
    "compare": {"point", "run", "compare", "cli_options"},
}


def sweep_subpackages_imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        modules = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module] + [f"{node.module}.{a.name}" for a in node.names if node.module == "sweep"]
        names.update(m.split(".")[1] for m in modules if m.startswith("sweep.") and m.count(".") >= 1)
    return names


@pytest.mark.parametrize("subpackage", sorted(SWEEP_LAYERS))
def test_sweep_subpackages_import_only_the_layers_below_them(subpackage: str) -> None:
    violations = []
    for path in sorted((ROOT / "sweep" / subpackage).rglob("*.py")):
        extra = sweep_subpackages_imported(path) - SWEEP_LAYERS[subpackage]
        violations += [f"{path.relative_to(ROOT)} imports sweep.{name}" for name in sorted(extra)]
    assert not violations, "\n".join(violations)


# typer belongs to the modules that declare `bench` commands. The lab studies, gpu_check and `bench throughput`'s
# command module still define their command beside the code they run, so they are named.
COMMAND_MODULE_NAMES = {"commands.py", "cli_options.py", "cli.py", "replay_commands.py", "quality_command.py"}
TYPER_ALSO_IN = {"engine/lab/", "engine/benchmarks/gpu_check.py", "engine/benchmarks/throughput.py"}


def test_only_command_modules_import_typer() -> None:
    offenders = []
    for package in ("engine", "sweep", "reports", "workloads"):
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if path.name in COMMAND_MODULE_NAMES or any(relative.startswith(p) for p in TYPER_ALSO_IN):
                continue
            if "typer" in imported_packages(path):
                offenders.append(relative)
    assert not offenders, "library modules that import typer:\n" + "\n".join(offenders)


def test_the_module_map_lists_every_module_and_only_existing_ones() -> None:
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text().split("## Module map", 1)[1]
    listed = {line.split("`")[1] for line in text.splitlines() if line.startswith("- `")}
    modules = {
        p.relative_to(ROOT).as_posix()
        for package in ("engine", "sweep", "workloads", "reports")
        for p in (ROOT / package).rglob("*.py")
        if "data" not in p.relative_to(ROOT).parts
    }
    assert sorted(modules - listed) == [], "modules missing from docs/ARCHITECTURE.md's module map"
    assert sorted(listed - modules) == [], "the module map lists modules that do not exist"


# A module's `_names` are its own: no library module imports one from another project module
# (`from engine.x import _y`) or reaches one through an imported project module (`x._y`, `x.Thing._y`).
PROJECT_PACKAGES = ("engine", "sweep", "reports", "workloads")


def private_names_used(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    project: dict[str, str] = {}  # local name -> the project module or object it is bound to
    found: list[str] = []

    def is_private(name: str) -> bool:
        return name.startswith("_") and not name.startswith("__")

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] not in PROJECT_PACKAGES:
                continue
            for alias in node.names:
                if is_private(alias.name):
                    found.append(f"line {node.lineno}: from {node.module} import {alias.name}")
                project[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in PROJECT_PACKAGES:
                    project[alias.asname or alias.name.split(".")[0]] = alias.name
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and is_private(node.attr):
            base = node.value
            while isinstance(base, ast.Attribute):
                base = base.value
            if isinstance(base, ast.Name) and base.id in project:
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_no_library_module_uses_another_modules_private_names() -> None:
    violations = [
        f"{path.relative_to(ROOT).as_posix()} {use}"
        for package in PROJECT_PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        for use in private_names_used(path)
    ]
    assert not violations, "private names used across modules:\n" + "\n".join(violations)


def test_the_private_name_check_sees_both_forms(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("from engine.config import _hidden\nimport sweep.run.results as r\nr._dumps(1)\n")
    assert [use.split(":")[0] for use in private_names_used(source)] == ["line 1", "line 3"]
