"""`mixture:` workloads with prompt-file components: `mixture:prompts:chat.jsonl=3,random=1`.

A mixture component is a length source (a shipped mix, a generator, a trace file; workloads.load) or a prompt file:
`prompts:FILE`, a shipped prompt set (`servelab-prompts`, also as `prompts:servelab-prompts`), or a JSON/JSONL path
whose first entry is prompt text (`prompt`, `messages` or ShareGPT `conversations`, and no `input_len`-style length
column). A mixture with at least one prompt-file component is a text workload (workloads.is_text_workload): each
request picks its component by weight (seeded); a prompt component's requests are its file's own text, drawn as a
plain prompt workload draws them (workloads.prompt_files: a seeded subset in file order, copies marked past the
file's rows), lengths counted with the target's tokenizer; a length component's requests are drawn uniformly from
its specs, as in workloads.synthetic.mixture, and synthesized to their lengths. Every request keeps its own class
(a prompt file's `class` field, a trace's class column), else takes its component's name: the file stem of a path
or prompt file, the name otherwise.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from workloads import prompt_files
from workloads.spec import RequestSpec, SynthesizedPrompt

MIXTURE = "mixture:"
TEXT_FIELDS = ("prompt", "messages", "conversations")


@dataclass(frozen=True)
class Component:
    source: str  # what workloads.load or prompt_files reads: a length source, or `prompts:FILE` / a prompt set
    weight: float
    name: str  # the class of its requests that carry none
    text: bool  # a prompt file: sent as its text


def looks_like_prompt_file(path: Path) -> bool:
    """A JSON/JSONL file whose first entry holds prompt text and no length column (not a length trace)."""
    from workloads.loaders import INPUT_ALIASES

    if path.suffix.lower() not in (".json", ".jsonl", ".ndjson") or not path.is_file():
        return False
    try:
        with open(path, encoding="utf-8") as handle:
            if path.suffix.lower() == ".json":  # the first entry only: a ShareGPT download is hundreds of MB
                text = handle.read(1 << 20)
                start = text.index("[") + 1
                while text[start] in " \t\r\n":
                    start += 1
                entry = json.JSONDecoder().raw_decode(text, start)[0]
            else:
                entry = json.loads(next(line for line in handle if line.strip()))
    except (ValueError, StopIteration, IndexError, UnicodeDecodeError):
        return False
    return isinstance(entry, dict) and any(k in entry for k in TEXT_FIELDS) and not any(
        k in entry for k in INPUT_ALIASES
    )


def parse_components(spec: str) -> list[Component]:
    """`a=3,b=1` (the part after `mixture:`) -> components; a weight left out is 1. ValueError for a bad weight."""
    components = []
    for part in spec.split(","):
        source, _, weight_text = part.partition("=")
        source = source.strip()
        try:
            weight = float(weight_text) if weight_text.strip() else 1.0
        except ValueError:
            raise ValueError(f"mixture component {part!r}: weight {weight_text!r} is not a number") from None
        path = Path(source).expanduser()
        if prompt_files.is_prompt_workload(source):
            text, name = True, prompt_files.prompt_file_path(source).stem if _exists(source) else source
        elif _is_prompt_source(source):
            source, text, name = f"{prompt_files.PREFIX}{source}", True, path.stem
        else:
            text, name = False, path.stem if path.is_file() else source
        components.append(Component(source, weight, name, text))
    return components


def _exists(source: str) -> bool:
    try:
        prompt_files.prompt_file_path(source)
    except (FileNotFoundError, ValueError):
        return False
    return True


def is_text_mixture(name: str) -> bool:
    """Whether `name` is a `mixture:` with at least one prompt-file component."""
    if not name.startswith(MIXTURE):
        return False
    sources = [part.partition("=")[0].strip() for part in name[len(MIXTURE) :].split(",")]  # weights: checked later
    return any(_is_prompt_source(source) for source in sources)


def _is_prompt_source(source: str) -> bool:
    return prompt_files.is_prompt_workload(source) or looks_like_prompt_file(Path(source).expanduser())


def _weights(components: list[Component]) -> np.ndarray:
    weights = np.array([c.weight for c in components], dtype=np.float64)
    if np.any(weights < 0) or weights.sum() <= 0:
        raise ValueError(f"mixture weights must be >= 0 with a positive sum, got {weights.tolist()}")
    return weights / weights.sum()


def _length_specs(component: Component, seed: int) -> list[RequestSpec]:
    import workloads

    try:
        specs = workloads.load(component.source, seed=seed)
    except ValueError as error:
        raise ValueError(f"mixture component {component.source!r}: {error}") from None
    if not specs:
        raise ValueError(f"mixture component {component.source!r} is empty")
    return specs


def _prompt_file(component: Component) -> prompt_files.PromptFile:
    try:
        return prompt_files.read_prompt_file(component.source)
    except FileNotFoundError as error:
        raise ValueError(f"mixture component {component.source!r}: {error}") from None


def check_text_mixture(name: str, seed: int = 0) -> None:
    """Every component readable and the weights usable: a ValueError naming the bad one (no tokenizer needed)."""
    components = parse_components(name[len(MIXTURE) :])
    _weights(components)
    for component in components:
        if component.text:
            _prompt_file(component)
        else:
            _length_specs(component, seed)


def prompt_components(name: str) -> list[prompt_files.PromptFile]:
    """The prompt files a mixture mixes in, read and checked (a ValueError names a missing one); [] for another
    workload."""
    if not name.startswith(MIXTURE):
        return []
    return [_prompt_file(c) for c in parse_components(name[len(MIXTURE) :]) if c.text]


def mixture_classes(name: str, seed: int = 0) -> list[str]:
    """Every class a request of the mixture can carry (its rows' own classes, and the components' names)."""
    found: list[str] = []
    for component in parse_components(name[len(MIXTURE) :]):
        if component.text:
            rows = _prompt_file(component).rows
            own = [row.request_class for row in rows]
        else:
            own = [spec.request_class for spec in _length_specs(component, seed)]
        found += [c for c in own if c is not None] + ([component.name] if None in own else [])
    return sorted(set(found))


def mixture_prompts(
    name: str, endpoint: str, output_len: int | None, tokenizer: Any, n: int, seed: int, salt: str
) -> tuple[list[RequestSpec], list[SynthesizedPrompt]]:
    """`n` requests of the text mixture `name` for `endpoint`, in the order the weighted draw gives them."""
    import workloads

    components = parse_components(name[len(MIXTURE) :])
    rng = np.random.default_rng(seed)
    choices = rng.choice(len(components), size=n, p=_weights(components))
    # every component is read, drawn or not, so a bad one fails the sweep's one-request check before anything is sent
    sources = {i: [] if c.text else _length_specs(c, seed) for i, c in enumerate(components)}
    for component in components:
        if component.text:
            _prompt_file(component)
    drawn: dict[int, list[tuple[RequestSpec, SynthesizedPrompt]]] = {}
    lengths: list[tuple[int, RequestSpec]] = []
    for index, component in enumerate(components):
        count = int(np.count_nonzero(choices == index))
        if not count:
            continue
        if component.text:
            specs, prompts = prompt_files.prompt_file_prompts(
                component.source, endpoint, output_len, tokenizer, count, seed + index, salt
            )
            drawn[index] = [
                (replace(s, request_class=s.request_class or component.name),
                 replace(p, request_class=p.request_class or component.name))
                for s, p in zip(specs, prompts, strict=True)
            ]  # fmt: skip
        else:
            source = sources[index]
            for _ in range(count):
                spec = source[int(rng.integers(len(source)))]
                lengths.append((index, RequestSpec(input_len=spec.input_len, output_len=spec.output_len,
                                                   schema=spec.schema,
                                                   request_class=spec.request_class or component.name)))  # fmt: skip
    if lengths:
        synthesized = workloads.synthesize([s for _, s in lengths], tokenizer, endpoint=endpoint, seed=seed, salt=salt)
        for (index, spec), prompt in zip(lengths, synthesized, strict=True):
            drawn.setdefault(index, []).append((spec, prompt))
    queues = {index: iter(pairs) for index, pairs in drawn.items()}
    ordered = [next(queues[int(index)]) for index in choices]
    return [s for s, _ in ordered], [p for _, p in ordered]
