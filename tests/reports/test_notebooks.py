"""The analysis notebooks run top to bottom on the committed fixture runs and are stored without outputs."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
NAMES = ("01_sweep_analysis.ipynb", "02_compare_runs.ipynb")


@pytest.mark.parametrize("name", NAMES)
def test_stored_without_outputs(name):
    book = nbformat.read(NOTEBOOKS / name, as_version=4)
    code = [c for c in book.cells if c.cell_type == "code"]
    assert code
    assert all(not c.outputs and c.execution_count is None for c in code)


@pytest.mark.parametrize("name", NAMES)
def test_executes(name, monkeypatch, fixtures_dir):
    monkeypatch.setenv("SERVELAB_RUN_DIR", str(fixtures_dir / "sweep_a"))
    monkeypatch.setenv("SERVELAB_RUN_A", str(fixtures_dir / "sweep_a"))
    monkeypatch.setenv("SERVELAB_RUN_B", str(fixtures_dir / "sweep_b"))
    book = nbformat.read(NOTEBOOKS / name, as_version=4)
    NotebookClient(book, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    errors = [o for c in book.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
    assert any(o.output_type == "display_data" for c in book.cells if c.cell_type == "code" for o in c.outputs)


def test_sweep_analysis_loads_through_the_results_contract():
    """The results contract's public entry point is `sweep.load_results`; the notebook shows users that import."""
    book = nbformat.read(NOTEBOOKS / "01_sweep_analysis.ipynb", as_version=4)
    imports = [line for c in book.cells if c.cell_type == "code" for line in c.source.splitlines() if "import" in line]
    assert "from sweep import load_results" in imports
