"""Every `bench …` command line in README.md and docs/*.md parses against the real CLI (nothing is run).

A line is resolved to its sub-command through the click groups of cli.py, then click's `make_context` parses its
arguments, so a wrong command name, an unknown option or a bad choice fails here. Hidden (old-alias) commands must
not appear in the docs. docs/benchmarks-history.md is the dated diary, commands as they were then: skipped.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import typer.main

import cli

ROOT = Path(__file__).resolve().parent.parent
SKIPPED = {"benchmarks-history.md"}


def _doc_files() -> list[Path]:
    return [ROOT / "README.md"] + sorted(p for p in (ROOT / "docs").glob("*.md") if p.name not in SKIPPED)


def _command_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, command) for each `bench …` line inside a fenced code block; continuations joined."""
    found: list[tuple[int, str]] = []
    in_block = False
    pending: tuple[int, str] | None = None
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.strip()
        if line.startswith("```"):
            in_block = not in_block
            pending = None
            continue
        if not in_block:
            continue
        if pending is not None:
            start, text = pending
            text = text + " " + line.rstrip("\\").strip()
            pending = (start, text) if line.endswith("\\") else None
            if pending is None:
                found.append((start, text))
            continue
        line = re.sub(r"^\$\s+", "", line)
        line = re.sub(r"^flock\s+\S+\s+", "", line)  # flock LOCK bench ...
        line = re.sub(r"^[A-Z_][A-Z0-9_]*=\S+\s+", "", line)  # VAR=value bench ...
        if not line.startswith("bench "):
            continue
        if line.endswith("\\"):
            pending = (number, line.rstrip("\\").strip())
        else:
            found.append((number, line))
    return found


def _cases() -> list:
    cases = []
    for path in _doc_files():
        for number, text in _command_lines(path):
            cases.append(pytest.param(text, id=f"{path.relative_to(ROOT)}:{number}"))
    return cases


def _strip_shell(text: str) -> list[str]:
    """The bench arguments alone: drop comments, pipes, redirections and `&&`/`;` tails."""
    text = text.split(" #")[0]
    text = re.split(r"\s(?:\||&&|;|>|2>|\|\|)\s?", text)[0]
    args: list[str] = []
    for arg in shlex.split(text)[1:]:
        if arg != "...":
            args.append(arg)
        elif args and args[-1].startswith("-"):
            args.append("<value>")  # `--url ...`: an elided value
    return args  # a bare `...` stands for elided flags


@pytest.mark.parametrize("text", _cases())
def test_docs_example_parses(text: str) -> None:
    # typer ships its own copy of click, so groups are recognised by their `commands` mapping.
    command = typer.main.get_command(cli.app)
    args = _strip_shell(text)
    path = ["bench"]
    while hasattr(command, "commands") and args and not args[0].startswith("-"):
        name = args.pop(0)
        sub = command.commands.get(name)
        assert sub is not None, f"no command {' '.join(path + [name])!r}"
        assert not sub.hidden, f"{' '.join(path + [name])!r} is a hidden old alias: use its new name"
        command = sub
        path.append(name)
    assert not hasattr(command, "commands"), f"{' '.join(path)!r} is a group, not a command"
    if any(word == "..." for word in text.split()) and "<value>" not in args:
        # A bare `...` elides flags, possibly required ones: then only the option names are checked.
        names = {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)}
        unknown = [arg for arg in args if arg.startswith("--") and arg.split("=")[0] not in names]
        assert not unknown, f"{' '.join(path)!r} has no option {unknown}"
        return
    command.make_context(" ".join(path), args)


def test_docs_have_examples() -> None:
    assert len(_cases()) > 20
