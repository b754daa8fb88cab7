"""Incremental detokenization on multi-byte text (SmolLM2's byte-level BPE splits CJK and emoji bytes)."""

from __future__ import annotations

import pytest

from engine.detokenizer import IncrementalDetokenizer
from engine.sampling_params import SamplingParams
from engine.tokenizer import get_tokenizer

TEXTS = [
    "日本語のテキストと中文混合",
    "Emoji party: 🙂🎉👩‍💻 done",
    "Héllo wörld, naïve façade, crème brûlée",
    " Ελληνικά και русский текст",
]


@pytest.fixture(scope="module")
def tokenizer():
    return get_tokenizer("smollm2-135m")


def stream(detok: IncrementalDetokenizer, ids: list[int]) -> tuple[list[str], str | None]:
    """Feed one token at a time like the engine does; return the deltas handed out and the stop string."""
    deltas, stop = [], None
    for token_id in ids:
        stop = detok.update([token_id])
        deltas.append(detok.get_next_output_text(finished=stop is not None, delta=True))
        if stop is not None:
            break
    else:
        deltas.append(detok.get_next_output_text(finished=True, delta=True))
    return deltas, stop


def test_the_texts_really_split_characters_across_tokens(tokenizer) -> None:
    for text in TEXTS[:2]:
        assert any("\ufffd" in tokenizer.decode([i]) for i in tokenizer.encode(text, add_special_tokens=False))


@pytest.mark.parametrize("text", TEXTS)
def test_incremental_text_equals_full_decode_without_broken_characters(tokenizer, text: str) -> None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, tokenizer.encode("Say:"), SamplingParams())
    deltas, stop = stream(detok, ids)
    assert stop is None
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == detok.output_text == tokenizer.decode(ids) == text


def test_prompt_context_keeps_the_first_tokens_leading_space(tokenizer) -> None:
    prompt = tokenizer.encode("The answer is")
    ids = tokenizer.encode("The answer is 42 ✓")[len(prompt) :]
    detok = IncrementalDetokenizer(tokenizer, prompt, SamplingParams())
    assert "".join(stream(detok, ids)[0]) == " 42 ✓"


@pytest.mark.parametrize(
    ("text", "stop", "expected"),
    [
        ("日本語のテキストと中文混合", "テキスト", "日本語の"),
        ("Emoji party: 🙂🎉 done", "🎉", "Emoji party: 🙂"),
        ("crème brûlée et café", "brûlée", "crème "),
    ],
)
def test_stop_strings_on_multibyte_text_are_never_emitted(tokenizer, text: str, stop: str, expected: str) -> None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, [], SamplingParams(stop=["never-there", stop]))
    deltas, reason = stream(detok, ids)
    assert reason == stop
    assert detok.output_text == expected and "".join(deltas) == expected
    emitted = ""
    for delta in deltas:
        emitted += delta
        assert expected.startswith(emitted)  # nothing is ever handed out and then taken back


def test_partial_match_is_held_back_until_resolved(tokenizer) -> None:
    ids = tokenizer.encode("Voilà café crème, pas café noir.", add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, [], SamplingParams(stop=["café noir!"]))
    held_seen = False
    emitted = ""
    for token_id in ids:
        assert detok.update([token_id]) is None
        emitted += detok.get_next_output_text(finished=False, delta=True)
        if detok.output_text.endswith("café"):
            assert not emitted.endswith("café")  # "café" could begin "café noir!": held back
            held_seen = True
    assert held_seen
    emitted += detok.get_next_output_text(finished=True, delta=True)
    assert emitted == detok.output_text == "Voilà café crème, pas café noir."


def test_include_stop_str_in_output_and_cumulative_text(tokenizer) -> None:
    ids = tokenizer.encode("one, two, three", add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, [], SamplingParams(stop=[" two"], include_stop_str_in_output=True))
    _, reason = stream(detok, ids)
    assert reason == " two" and detok.output_text == "one, two"
    assert detok.get_next_output_text(finished=True, delta=False) == "one, two"


def test_stop_string_waits_for_min_tokens(tokenizer) -> None:
    ids = tokenizer.encode("stop now stop", add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, [], SamplingParams(stop=["stop"], min_tokens=2))
    _, reason = stream(detok, ids)
    assert reason == "stop" and detok.output_text == "stop now "


def test_special_tokens_skipped_or_shown(tokenizer) -> None:
    eos = tokenizer.eos_token_id
    ids = tokenizer.encode("hi there", add_special_tokens=False) + [eos]
    skipped = IncrementalDetokenizer(tokenizer, [], SamplingParams())
    shown = IncrementalDetokenizer(tokenizer, [], SamplingParams(skip_special_tokens=False))
    stream(skipped, ids)
    stream(shown, ids)
    assert skipped.output_text == "hi there"
    assert shown.output_text == "hi there" + tokenizer.eos_token
    assert skipped.output_token_ids == ids
