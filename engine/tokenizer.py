"""Tokenizer loading for model aliases, HF directories, hub ids and GGUF files.

Tokenizers read from a GGUF file are converted once and cached as an HF tokenizer directory under
`model_files.cache_dir()`: a GGUF conversion takes seconds, a directory load a fraction of one.
"""

from __future__ import annotations

import os
import shutil
from functools import lru_cache
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from engine.model_files import ModelNotFoundError, cache_dir, smollm2_gguf_path

# Aliases whose tokenizer is SmolLM2's (tiny-random borrows it so its text is real text).
SMOLLM2_TOKENIZER_ALIASES = ("smollm2-135m", "tiny-random")


def _load_gguf_tokenizer(gguf_path: Path, cache_name: str) -> PreTrainedTokenizerBase:
    cached = cache_dir() / "tokenizers" / cache_name
    if (cached / "tokenizer_config.json").is_file():
        return AutoTokenizer.from_pretrained(cached)
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    tmp = cached.with_name(cached.name + f".tmp{os.getpid()}")
    tokenizer.save_pretrained(tmp)
    try:
        tmp.replace(cached)  # atomic publish; a concurrent process may have published first
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
    return tokenizer


@lru_cache(maxsize=8)
def get_tokenizer(name: str) -> PreTrainedTokenizerBase:
    """Resolve `smollm2-135m`, `tiny-random`, an HF directory, a .gguf file or a hub id."""
    if name in SMOLLM2_TOKENIZER_ALIASES:
        return _load_gguf_tokenizer(smollm2_gguf_path(), "smollm2-135m")
    path = Path(name).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelNotFoundError(f"GGUF file {path} does not exist")
        return _load_gguf_tokenizer(path, path.stem)
    if path.is_dir():
        return AutoTokenizer.from_pretrained(path)
    try:
        return AutoTokenizer.from_pretrained(name)
    except OSError as error:
        raise ModelNotFoundError(
            f"cannot find tokenizer {name!r}: pass an alias ({', '.join(SMOLLM2_TOKENIZER_ALIASES)}), "
            "an HF model directory, a .gguf file, or a hub id with network access"
        ) from error
