"""xgrammar behind structured outputs: spec → Grammar (no tokenizer needed, so request validation can run where
the request is parsed), and Grammar → CompiledGrammar against the model's tokenizer (in the engine)."""

from __future__ import annotations

import json
import re
from typing import Any

import xgrammar as xgr

from engine.structured_output.params import StructuredOutputsError, StructuredOutputsParams, choice_as_ebnf

# xgrammar prefixes its errors with "[hh:mm:ss] /path/file.cc:line: "; the rest is the compiler's message.
_LOG_PREFIX = re.compile(r"^\[[\d:]+\] \S+:\d+: ")


def compiler_message(error: Exception) -> str:
    text = str(error).strip()
    return _LOG_PREFIX.sub("", text.splitlines()[0] if text else type(error).__name__)


def build_grammar(params: StructuredOutputsParams) -> xgr.Grammar:
    """The grammar `params` asks for; StructuredOutputsError with xgrammar's message if it refuses the spec.

    JSON schemas compile in xgrammar's strict mode (no properties or items beyond the schema's), as OpenAI's
    `strict` schemas; `json_object` is any JSON object.
    """
    kind = params.kind
    try:
        if kind == "json":
            schema = params.json if isinstance(params.json, str) else json.dumps(params.json)
            return xgr.Grammar.from_json_schema(schema, any_whitespace=not params.disable_any_whitespace)
        if kind == "json_object":
            return xgr.Grammar.from_json_schema(
                '{"type": "object"}', any_whitespace=not params.disable_any_whitespace, strict_mode=False
            )
        if kind == "regex":
            assert params.regex is not None
            return xgr.Grammar.from_regex(params.regex)
        if kind == "choice":
            assert params.choice is not None
            return xgr.Grammar.from_ebnf(choice_as_ebnf(params.choice))
        assert params.grammar is not None
        return xgr.Grammar.from_ebnf(params.grammar)
    except (RuntimeError, ValueError, TypeError) as error:
        raise StructuredOutputsError(f"invalid {kind} for structured outputs: {compiler_message(error)}") from error


def validate_structured_outputs(params: StructuredOutputsParams) -> None:
    """Raise StructuredOutputsError (the compiler's message) unless xgrammar accepts the spec."""
    build_grammar(params)


class XgrammarBackend:
    """Compiles grammars for one model: its tokenizer's vocabulary, padded to the logits width, with the engine's
    EOS ids as the tokens that end a completed grammar."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: list[int]) -> None:
        self.vocab_size = vocab_size
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=stop_token_ids)
        # One thread: compiles already run off the engine loop, and the machine's cores belong to the model.
        # The manager keeps its own cache by (kind, spec), so xgrammar's is off.
        self.compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)

    def compile(self, params: StructuredOutputsParams) -> xgr.CompiledGrammar:
        return self.compiler.compile_grammar(build_grammar(params))

    def new_matcher(self, compiled: xgr.CompiledGrammar) -> xgr.GrammarMatcher:
        return xgr.GrammarMatcher(compiled)

    def allocate_bitmask(self, num_rows: int) -> Any:
        """int32 [num_rows, ceil(vocab/32)], every bit set (all tokens allowed)."""
        return xgr.allocate_token_bitmask(num_rows, self.vocab_size)
