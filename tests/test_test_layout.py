"""pytest collects this suite without packages (no __init__.py), so two test modules with one basename collide."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def test_test_module_basenames_are_unique() -> None:
    names = Counter(p.name for p in TESTS.rglob("*.py") if p.name != "conftest.py")
    assert [name for name, count in names.items() if count > 1] == []
