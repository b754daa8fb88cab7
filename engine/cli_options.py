"""The engine knobs as `bench` options, generated from the config fields (engine/config.py).

`with_engine_knobs` gives a command one option per engine knob, under the knob's vLLM flag in the "Engine
knobs" help panel, and hands the command `engine_knobs`: the knobs the user set (an unset knob keeps the
engine config's own default). A choice knob's option takes only the values of its field's `Literal` type, and
--help lists them. A command that also uses a knob for itself (`--model`, sweep's `--seed`)
declares that parameter with `knob_option`, so the flag and panel stay the knob's and the help says the
command's meaning; its value is then the command's to pass on.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Annotated, Any, Literal, TypeVar

import typer

from engine.config import KnobSpec, engine_knobs

ENGINE_PANEL = "Engine knobs"
KNOBS_PARAMETER = "engine_knobs"

Command = TypeVar("Command", bound=Callable[..., Any])


def knob_option(name: str, default: Any = None, help: str | None = None) -> Any:
    """The typer.Option of engine knob `name` (its flags, the Engine knobs panel), for a command's own parameter."""
    spec = engine_knobs()[name]
    return typer.Option(default, _declaration(spec), help=help or spec.help, rich_help_panel=ENGINE_PANEL)


def _declaration(spec: KnobSpec) -> str:
    return "/".join(spec.flags)


def _parameter(spec: KnobSpec) -> inspect.Parameter:
    option = typer.Option(
        _declaration(spec), help=spec.help, rich_help_panel=ENGINE_PANEL, parser=spec.parse,
        metavar=None if spec.parse is None else "<text>",  # the parser takes more than the type's own spelling
    )  # fmt: skip
    # A choice knob (a Literal-typed field) takes only its values, and --help lists them: `<auto|torch|triton>`.
    value_type: Any = spec.value_type if spec.choices is None else Literal[spec.choices]
    return inspect.Parameter(
        spec.name,
        inspect.Parameter.KEYWORD_ONLY,
        default=None,
        annotation=Annotated[value_type | None, option],
    )


def with_engine_knobs(command: Command) -> Command:
    """Add an option for every engine knob the command does not declare itself; pass the set ones as `engine_knobs`.

    The command takes an `engine_knobs: dict[str, Any]` parameter, which is not an option.
    """
    signature = inspect.signature(command, eval_str=True)
    if KNOBS_PARAMETER not in signature.parameters:
        raise TypeError(f"{command.__name__} needs an {KNOBS_PARAMETER} parameter to receive the knobs")
    own = [p for p in signature.parameters.values() if p.name != KNOBS_PARAMETER]
    generated = [_parameter(spec) for name, spec in engine_knobs().items() if name not in signature.parameters]
    generated_names = [p.name for p in generated]

    @functools.wraps(command)
    def with_knobs(**kwargs: Any) -> Any:
        knobs = {name: kwargs.pop(name) for name in generated_names}
        return command(**kwargs, **{KNOBS_PARAMETER: {k: v for k, v in knobs.items() if v is not None}})

    positional = [p for p in own if p.kind is not inspect.Parameter.KEYWORD_ONLY]
    keyword = [p for p in own if p.kind is inspect.Parameter.KEYWORD_ONLY]
    with_knobs.__signature__ = signature.replace(parameters=[*positional, *generated, *keyword])  # type: ignore[attr-defined]
    with_knobs.__annotations__ = {p.name: p.annotation for p in [*own, *generated]}
    return with_knobs  # type: ignore[return-value]


def renamed_command(command: Command, new_spelling: str) -> Command:
    """`command` under its old name: the same options and behaviour, after one stderr line naming the new spelling.

    Registered hidden (`app.command(old, hidden=True)(renamed_command(fn, "bench lab gate-study"))`), so
    `bench --help` lists only the new names while scripts that use an old one keep working for a release.
    """

    @functools.wraps(command)
    def run_renamed(*args: Any, **kwargs: Any) -> Any:
        typer.echo(f"note: this command is now `{new_spelling}`; the old name goes in the next release", err=True)
        return command(*args, **kwargs)

    return run_renamed  # type: ignore[return-value]
