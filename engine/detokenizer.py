"""Incremental detokenization with stop strings (one per request; the server runs it in its API process).

Text grows by decoding a short window of token ids twice: [prefix_offset, read_offset) and
[prefix_offset, end). The difference is the new text, emitted only once it no longer ends in U+FFFD —
i.e. once the byte-level BPE pieces of a multi-byte character are all there. The window starts on the
last few prompt tokens so the first output token's leading space decodes as it would in context.

Stop strings are searched only in text that could contain a new match, and the text is truncated before
the match (or after it with include_stop_str_in_output). A suffix of the text that is the start of some
stop string is held back from get_next_output_text until it either completes the stop string (and is
dropped) or stops matching (and is released).
"""

from __future__ import annotations

from typing import Any

from engine.sampling_params import SamplingParams

INITIAL_CONTEXT_TOKENS = 5
_REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Any, prompt_token_ids: list[int], params: SamplingParams) -> None:
        self.tokenizer = tokenizer
        self.params = params
        self.stop = list(params.stop)
        self.max_stop_len = max((len(s) for s in self.stop), default=0)
        self._special_ids = set(tokenizer.all_special_ids) if params.skip_special_tokens else set()
        context = [t for t in prompt_token_ids if t not in self._special_ids][-INITIAL_CONTEXT_TOKENS:]
        self._ids = context  # the decode window's backing list: prompt context + kept output ids
        self._prefix_offset = 0
        self._read_offset = len(context)
        self.output_token_ids: list[int] = []
        self.output_text = ""
        self.stop_reason: str | None = None
        self._num_emitted_chars = 0

    def update(self, new_token_ids: list[int]) -> str | None:
        """Append tokens; if a stop string now appears, truncate the text and return that string."""
        if self.stop_reason is not None:
            return self.stop_reason
        text_len_before = len(self.output_text)
        for token_id in new_token_ids:
            self.output_token_ids.append(token_id)
            if token_id in self._special_ids:
                continue
            self._ids.append(token_id)
            self.output_text += self._decode_next()
        if not self.stop or len(self.output_token_ids) <= self.params.min_tokens:
            return None
        return self._check_stop_strings(text_len_before)

    def get_next_output_text(self, finished: bool, delta: bool) -> str:
        """The text so far (delta: only what was not returned before), minus a held-back partial stop match."""
        end = len(self.output_text)
        if not finished and not self.params.include_stop_str_in_output:
            end -= self._partial_stop_len()
        if not delta:
            return self.output_text[:end]
        text = self.output_text[self._num_emitted_chars : end]
        self._num_emitted_chars = max(self._num_emitted_chars, end)
        return text

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(
            ids, skip_special_tokens=self.params.skip_special_tokens, clean_up_tokenization_spaces=False
        )

    def _decode_next(self) -> str:
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        full_text = self._decode(self._ids[self._prefix_offset :])
        if len(full_text) <= len(prefix_text) or full_text.endswith(_REPLACEMENT_CHAR):
            return ""  # an incomplete multi-byte character: wait for its next piece
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        return full_text[len(prefix_text) :]

    def _check_stop_strings(self, text_len_before: int) -> str | None:
        best: tuple[int, str] | None = None
        for stop in self.stop:
            # A new match must end in the new text, so it starts at most len(stop)-1 chars before it.
            index = self.output_text.find(stop, max(0, text_len_before - len(stop) + 1))
            if index != -1 and (best is None or index < best[0]):
                best = (index, stop)
        if best is None:
            return None
        index, stop = best
        self.output_text = self.output_text[: index + len(stop) if self.params.include_stop_str_in_output else index]
        self.stop_reason = stop
        return stop

    def _partial_stop_len(self) -> int:
        """Length of the longest suffix of the text that is a proper prefix of a stop string."""
        text = self.output_text
        for length in range(min(self.max_stop_len - 1, len(text)), 0, -1):
            suffix = text[-length:]
            if any(stop.startswith(suffix) for stop in self.stop):
                return length
        return 0
