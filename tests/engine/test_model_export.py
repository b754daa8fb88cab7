"""`bench model export-hf`: a plain float32 HF directory transformers loads, with our engine's weights and output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer
from typer.testing import CliRunner

from cli import app
from engine import LLM, SamplingParams
from engine.model_export import EXPORT_MARKER, ExportError, export_hf
from engine.model_files import (
    TINY_RANDOM_CONFIG,
    gguf_to_hf,
    iter_safetensors,
    materialize_random_model,
    resolve_model,
    smollm2_gguf_path,
)
from engine.tokenizer import get_tokenizer

PROMPTS = ["The capital of France is", "Hi", "List five prime numbers and explain why each is prime."]


def _export(model: str, output_dir: Path) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["model", "export-hf", model, "--output-dir", str(output_dir)])
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    output_dir = tmp_path_factory.mktemp("export") / "tiny-random-hf"
    code, stdout, stderr = _export("tiny-random", output_dir)
    assert code == 0, stderr
    assert stdout.strip() == str(output_dir)
    return output_dir, stderr


def test_the_export_is_a_plain_float32_llama_with_the_tokenizer(exported: tuple[Path, str]) -> None:
    output_dir, output = exported
    assert output.splitlines()[0].startswith("[export-hf] resolving tiny-random")
    assert f"checked 21 tensors equal to the source; wrote {output_dir}" in output
    config = json.loads((output_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in config
    assert config["dtype"] == "float32"
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json", EXPORT_MARKER):
        assert (output_dir / name).is_file(), name
    source = dict(iter_safetensors(resolve_model("tiny-random")))
    written = load_file(str(output_dir / "model.safetensors"))
    assert written.keys() == source.keys()
    for name, tensor in written.items():
        assert tensor.dtype == torch.float32 and torch.equal(tensor, source[name]), name
    tokenizer = AutoTokenizer.from_pretrained(output_dir)
    assert tokenizer.encode(PROMPTS[0]) == get_tokenizer("tiny-random").encode(PROMPTS[0])


def test_transformers_greedy_output_on_the_export_equals_the_engine(exported: tuple[Path, str]) -> None:
    output_dir, _ = exported
    tokenizer = get_tokenizer("tiny-random")
    prompts = [tokenizer.encode(text) for text in PROMPTS]
    hf = AutoModelForCausalLM.from_pretrained(output_dir, dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None
    expected = []
    with torch.inference_mode():
        for ids in prompts:
            input_ids = torch.tensor([ids])
            out = hf.generate(input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=12,
                              do_sample=False, pad_token_id=0)  # fmt: skip
            expected.append(out[0, len(ids):].tolist())
    llm = LLM("tiny-random", dtype="float32", max_model_len=128)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompts], params, use_tqdm=False)
    assert [out.outputs[0].token_ids for out in outputs] == expected


def test_a_second_export_to_the_same_directory_is_reused(exported: tuple[Path, str]) -> None:
    output_dir, _ = exported
    mtime = (output_dir / "model.safetensors").stat().st_mtime_ns
    code, stdout, stderr = _export("tiny-random", output_dir)
    assert code == 0 and stdout.strip() == str(output_dir)
    assert "already holds this export of tiny-random (21 tensors): reused" in stderr
    assert (output_dir / "model.safetensors").stat().st_mtime_ns == mtime


def test_tied_embeddings_are_written_once_and_tie_again_on_loading(tmp_path: Path) -> None:
    config = dict(TINY_RANDOM_CONFIG, tie_word_embeddings=True, vocab_size=512)
    source = materialize_random_model(tmp_path / "tied", config, seed=3, tokenizer_name="tiny-random")
    result = export_hf(str(source), tmp_path / "out")
    written = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert "lm_head.weight" not in written and result.num_tensors == len(written) == 20
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32)
    assert torch.equal(hf.lm_head.weight, load_file(str(source / "model.safetensors"))["model.embed_tokens.weight"])


def test_a_non_empty_directory_that_is_no_export_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    code, _, stderr = _export("no-such-org/no-such-model", tmp_path)  # refused before the model is looked up
    assert code == 2 and "is not empty and holds no servelab export" in stderr
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_a_file_as_output_dir_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    code, _, stderr = _export("tiny-random", tmp_path / "file")
    assert code == 2 and "exists and is not a directory" in stderr


def test_an_export_of_another_source_is_not_overwritten(exported: tuple[Path, str], tmp_path: Path) -> None:
    output_dir, _ = exported
    other = materialize_random_model(tmp_path / "other", TINY_RANDOM_CONFIG, seed=5, tokenizer_name="tiny-random")
    with pytest.raises(ExportError, match="holds an export of another source"):
        export_hf(str(other), output_dir)


def test_a_missing_model_is_a_usage_error(tmp_path: Path) -> None:
    code, _, stderr = _export(str(tmp_path / "nope.gguf"), tmp_path / "out")
    assert code == 2 and "does not exist" in stderr and not (tmp_path / "out").exists()


@pytest.mark.slow
def test_the_default_gguf_exports_to_its_dequantised_weights_and_the_engines_greedy_output(tmp_path: Path) -> None:
    output_dir = tmp_path / "smollm2-135m-hf"
    code, stdout, stderr = _export("smollm2-135m", output_dir)
    assert code == 0 and stdout.strip() == str(output_dir), stderr
    config = json.loads((output_dir / "config.json").read_text())
    assert "quantization_config" not in config and config["tie_word_embeddings"] is True
    written = load_file(str(output_dir / "model.safetensors"))
    _, tensors = gguf_to_hf(smollm2_gguf_path())  # straight from the GGUF, not from the engine's cache
    dequantised = dict(tensors)
    assert written.keys() == dequantised.keys() and len(written) == 272
    for name, tensor in written.items():
        assert tensor.dtype == torch.float32 and torch.equal(tensor, dequantised[name]), name
    del written, dequantised
    tokenizer = get_tokenizer("smollm2-135m")
    prompts = [tokenizer.encode(text) for text in PROMPTS[:2]]
    hf = AutoModelForCausalLM.from_pretrained(output_dir, dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None
    with torch.inference_mode():
        expected = [hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                max_new_tokens=8, do_sample=False, pad_token_id=0)[0, len(ids):].tolist()
                    for ids in prompts]  # fmt: skip
    del hf
    llm = LLM("smollm2-135m", dtype="float32", max_model_len=128)
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompts], params, use_tqdm=False)
    assert [out.outputs[0].token_ids for out in outputs] == expected
