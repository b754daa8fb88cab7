"""Export a model as a plain HF directory that other engines (vLLM, transformers) load as is.

The source is what our engine serves: `resolve_model` (the default GGUF dequantised by our loader, `tiny-random`, an
HF directory or a .gguf file). The export is a plain transformers checkpoint: a config built by transformers for the
architecture with no `quantization_config`, the weights loaded into that model with `strict=True` (every tensor
present, none left over), each written tensor read back and checked equal to the source, float32 safetensors, the
tokenizer files and a `servelab-export.json` that names the source, so a second export to the same directory is
recognised and reused.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.model_files import iter_safetensors, load_hf_config, resolve_model

EXPORT_MARKER = "servelab-export.json"
EXPORT_FORMAT_VERSION = 1
_DROPPED_CONFIG_KEYS = ("quantization_config", "torch_dtype", "dtype", "transformers_version")


class ExportError(ValueError):
    """The export cannot be made or checked; the message says why."""


@dataclass(frozen=True)
class ExportResult:
    """Where the export is, how many tensors it holds, and whether an earlier export was reused."""

    path: Path
    num_tensors: int
    reused: bool


def _source_record(model: str, source: Path) -> dict[str, Any]:
    weights = sorted(source.glob("*.safetensors"))
    return {
        "format_version": EXPORT_FORMAT_VERSION,
        "model": model,
        "source": str(source),
        "source_bytes": sum(p.stat().st_size for p in weights),
        "dtype": "float32",
    }


def _reusable(output_dir: Path, record: dict[str, Any]) -> int | None:
    """The tensor count of an earlier export of the same source in `output_dir`, else None."""
    marker = output_dir / EXPORT_MARKER
    if not marker.is_file():
        return None
    previous = json.loads(marker.read_text())
    if any(previous.get(key) != value for key, value in record.items()):
        return None
    if not (output_dir / "config.json").is_file() or not any(output_dir.glob("*.safetensors")):
        return None
    return int(previous.get("num_tensors", 0))


def _plain_model(hf_config: dict[str, Any]) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = {k: v for k, v in hf_config.items() if k not in _DROPPED_CONFIG_KEYS and k != "model_type"}
    model_type = hf_config.get("model_type")
    try:
        config = AutoConfig.for_model(model_type, **fields)
    except (KeyError, ValueError) as error:
        raise ExportError(f"transformers has no config for model_type {model_type!r}") from error
    config.dtype = torch.float32
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def _source_tensors(source: Path, hf_config: dict[str, Any]) -> dict[str, torch.Tensor]:
    tensors = {name: tensor.to(torch.float32) for name, tensor in iter_safetensors(source)}
    if hf_config.get("tie_word_embeddings") and "lm_head.weight" not in tensors:
        tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"]  # tied: transformers' state dict names both
    return tensors


def _check_equal(expected: dict[str, torch.Tensor], written: dict[str, torch.Tensor], where: str) -> None:
    missing = sorted(set(expected) - set(written))
    if missing:
        raise ExportError(f"{where}: {len(missing)} tensors missing, first {missing[0]}")
    for name, tensor in written.items():
        if name not in expected:
            raise ExportError(f"{where}: unexpected tensor {name}")
        if tensor.dtype != torch.float32 or not torch.equal(tensor, expected[name]):
            raise ExportError(f"{where}: tensor {name} differs from the source")


def check_output_dir(output_dir: Path) -> None:
    """Refuse an output path that is a file, or a non-empty directory that holds no earlier export."""
    if output_dir.exists() and not output_dir.is_dir():
        raise ExportError(f"--output-dir {output_dir} exists and is not a directory")
    if output_dir.is_dir() and any(output_dir.iterdir()) and not (output_dir / EXPORT_MARKER).is_file():
        raise ExportError(
            f"--output-dir {output_dir} is not empty and holds no servelab export: "
            "pass an empty or new directory, or remove it"
        )


def export_hf(
    model: str, output_dir: Path, tokenizer: str | None = None, log: Callable[[str], None] = lambda _: None
) -> ExportResult:
    """Export `model` (anything `resolve_model` takes) as a float32 HF directory at `output_dir`.

    An earlier export of the same source there is reused; a non-empty `output_dir` holding anything else is refused.
    """
    output_dir = output_dir.expanduser()
    check_output_dir(output_dir)
    log(f"resolving {model}")
    source = resolve_model(model)
    record = _source_record(model, source)
    count = _reusable(output_dir, record)
    if count is not None:
        log(f"{output_dir} already holds this export of {model} ({count} tensors): reused")
        return ExportResult(output_dir, count, reused=True)
    if output_dir.is_dir() and any(output_dir.iterdir()):
        raise ExportError(
            f"{output_dir} holds an export of another source than {model} ({source}): "
            "pass a new --output-dir, or remove it"
        )

    from engine.tokenizer import get_tokenizer

    hf_config = load_hf_config(source)
    log(f"loading the weights of {source} into a plain {hf_config.get('architectures', ['?'])[0]} (strict)")
    expected = _source_tensors(source, hf_config)
    hf_model = _plain_model(hf_config)
    try:
        hf_model.load_state_dict(expected, strict=True)
    except RuntimeError as error:
        raise ExportError(f"the weights of {source} do not fit the architecture: {error}") from error
    hf_model.tie_weights()
    _check_equal(expected, {k: v for k, v in hf_model.state_dict().items()}, "after loading")

    tmp = output_dir.with_name(f"{output_dir.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    log(f"writing float32 safetensors and the tokenizer to {output_dir}")
    hf_model.save_pretrained(tmp, safe_serialization=True)
    get_tokenizer(model if model in ("smollm2-135m", "tiny-random") else str(source)).save_pretrained(tmp)
    written = dict(iter_safetensors(tmp))
    if hf_config.get("tie_word_embeddings"):
        expected.pop("lm_head.weight", None)  # save_pretrained writes a tied weight once
    _check_equal(expected, written, f"read back from {tmp}")
    saved_config = load_hf_config(tmp)
    if "quantization_config" in saved_config:
        raise ExportError("the written config.json still has a quantization_config")
    (tmp / EXPORT_MARKER).write_text(json.dumps({**record, "num_tensors": len(written)}, indent=2) + "\n")
    if output_dir.is_dir():
        output_dir.rmdir()  # empty (checked above)
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp.replace(output_dir)
    log(f"checked {len(written)} tensors equal to the source; wrote {output_dir}")
    return ExportResult(output_dir, len(written), reused=False)
