"""Copy-heavy requests: prompts that ask to repeat, edit or summarise a passage they contain.

Their answers reuse long runs of the prompt's tokens, which is where prompt-lookup (n-gram) speculative decoding
pays. Passages are built from seeded sentence templates, so a seed always gives the same prompts. Each request is
text (a chat message) plus its output length; `bench spec-decode --workload copy-heavy` and `bench sweep --workload
copy-heavy` send them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

TASKS = ("repeat", "edit", "summarise")
_ADJECTIVES = ("quiet", "busy", "old", "narrow", "bright", "small", "northern", "wooden", "famous", "empty")
_NOUNS = ("library", "harbour", "market", "bridge", "garden", "station", "museum", "village", "river", "tower")
_PEOPLE = ("the baker", "a teacher", "the mayor", "two students", "a fisherman", "the engineer", "our neighbour")
_VERBS = ("visited", "painted", "repaired", "described", "photographed", "measured", "cleaned", "opened")
_TIMES = ("every morning", "last winter", "in the spring", "after the storm", "before sunrise", "on market day")
_TEMPLATES = (
    "{person} {verb} the {adj} {noun} {time}.",
    "Near the {noun}, {person} {verb} a {adj} {noun2}.",
    "The {adj} {noun} was {verb} by {person} {time}.",
    "{time_cap}, {person} walked from the {noun} to the {adj} {noun2}.",
)
_INSTRUCTIONS = {
    "repeat": "Repeat the passage above word for word.",
    "edit": "Rewrite the passage above, replacing the word '{old}' with '{new}' everywhere and changing nothing else.",
    "summarise": "Summarise the passage above, quoting its most important sentences exactly.",
}


@dataclass(frozen=True)
class TextRequest:
    """One request given as text: a single user message, and how many tokens to generate at most."""

    prompt: str
    output_len: int
    task: str


def _sentence(rng: np.random.Generator) -> str:
    def pick(options: tuple[str, ...]) -> str:
        return options[int(rng.integers(len(options)))]

    time = pick(_TIMES)
    text = pick(_TEMPLATES).format(
        person=pick(_PEOPLE), verb=pick(_VERBS), adj=pick(_ADJECTIVES), noun=pick(_NOUNS), noun2=pick(_NOUNS),
        time=time, time_cap=time[0].upper() + time[1:],
    )  # fmt: skip
    return text[0].upper() + text[1:]


def copy_heavy(
    num_requests: int, seed: int = 0, sentences: tuple[int, int] = (5, 9), output_len: int = 128
) -> list[TextRequest]:
    """`num_requests` requests cycling through the tasks (repeat, edit, summarise), each over a passage of
    `sentences[0]`..`sentences[1]` seeded sentences."""
    if num_requests < 1 or output_len < 1:
        raise ValueError(f"num_requests and output_len must be >= 1, got {num_requests} and {output_len}")
    low, high = sentences
    if not 1 <= low <= high:
        raise ValueError(f"sentences must be (low, high) with 1 <= low <= high, got {sentences}")
    rng = np.random.default_rng(seed)
    requests = []
    for index in range(num_requests):
        task = TASKS[index % len(TASKS)]
        passage = " ".join(_sentence(rng) for _ in range(int(rng.integers(low, high + 1))))
        # An edit replaces the passage's last noun, which therefore occurs in it.
        instruction = _INSTRUCTIONS[task].format(old=passage.split()[-1].rstrip("."), new="place")
        requests.append(TextRequest(f"Passage:\n\n{passage}\n\n{instruction}", output_len, task))
    return requests
