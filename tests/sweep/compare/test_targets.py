"""`bench compare --target NAME=SPEC`: the spec grammar, its errors, and each kind's launch template."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from sweep.compare import targets as t
from sweep.compare.targets import Target, TargetError, check_targets, launch_template, parse_target


def test_each_kind_parses() -> None:
    assert parse_target("base=engine") == Target("base", "engine")
    assert parse_target("q8=engine:quantization=int8,max_num_seqs=8") == Target(
        "q8", "engine", knobs={"quantization": "int8", "max_num_seqs": 8}
    )
    assert parse_target("old=ref:HEAD~1") == Target("old", "ref", "HEAD~1")
    assert parse_target("old=ref:main:enable_prefix_caching=false").knobs == {"enable_prefix_caching": False}
    vllm = "vllm serve {model} --port {port}"
    assert parse_target(f"v=cmd:{vllm}") == Target("v", "cmd", vllm)
    assert parse_target("u=url:http://127.0.0.1:8000/v1") == Target("u", "url", "http://127.0.0.1:8000")
    assert parse_target("l=llama.cpp") == Target("l", "llama.cpp")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("engine", "NAME=SPEC"),
        ("a=", "NAME=SPEC"),
        ("a=docker:x", "unknown spec"),
        ("a=engine:max_num_seqs", "KNOB=V"),
        ("a=engine:no_such_knob=1", "not an engine knob"),
        ("a=engine:max_num_seqs=eight", "'eight' is not an integer"),
        ("a=engine:max_num_seqs=1,max_num_seqs=2", "given twice"),
        ("a=engine:model=tiny-random", "same --model"),
        ("a=ref:", "needs a value"),
        ("a=cmd:", "needs a value"),
        ("a=url:localhost:8000", "http://HOST:PORT"),
        ("a=url:http://127.0.0.1:8000:max_num_seqs=8", "no engine knobs"),
        ("a=llama.cpp:n_ctx=8", "no knobs"),
        ("a/b=engine", "names a directory"),
    ],
)
def test_malformed_specs_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(TargetError, match=message):
        parse_target(text)


def test_a_set_of_targets_is_checked() -> None:
    with pytest.raises(TargetError, match="at least two"):
        check_targets([Target("a", "engine")])
    with pytest.raises(TargetError, match="given twice: a"):
        check_targets([Target("a", "engine"), Target("a", "engine", knobs={"max_num_seqs": 2})])
    check_targets([Target("a", "engine"), Target("b", "url", "http://127.0.0.1:1")])


def test_llama_cpp_must_be_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(t.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(TargetError, match="llama-cpp-python"):
        check_targets([Target("a", "engine"), Target("b", "llama.cpp")])


def test_templates() -> None:
    cmd = Target("c", "cmd", "srv {model} --port {port}", extra_args=("--delay", "{x}"))
    assert launch_template(cmd, "m", {}, None, 512) == "srv {model} --port {port} --delay '{{x}}'"
    assert launch_template(Target("e", "engine", knobs={"max_num_seqs": 8}), "m", {"max_num_seqs": 8}, None, 1) is None
    assert launch_template(Target("u", "url", "http://h:1"), "m", {}, None, 1) is None
    ref = launch_template(Target("r", "ref", "HEAD", extra_args=("--inject-step-delay-ms", "3")), "tiny-random",
                          {"max_num_seqs": 8}, Path("/tmp/wt"), 1)  # fmt: skip
    assert ref is not None
    argv = shlex.split(ref.format(model="tiny-random", host="127.0.0.1", port=8000))
    assert argv[:2] == ["env", "PYTHONPATH=/tmp/wt"] and argv[3:7] == ["-P", "-m", "cli", "serve"]
    assert argv[7:] == ["tiny-random", "--host", "127.0.0.1", "--port", "8000", "--max-num-seqs", "8",
                        "--inject-step-delay-ms", "3"]  # fmt: skip


def test_the_llama_cpp_template_keeps_its_server_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    gguf = tmp_path / "model {odd}.gguf"
    gguf.write_bytes(b"")
    template = launch_template(Target("l", "llama.cpp"), str(gguf), {"cpu_threads": 3}, None, 448)
    assert template is not None
    argv = shlex.split(template.format(model="smollm2", host="127.0.0.1", port=8123))
    assert argv[1:3] == ["-m", "llama_cpp.server"]
    pairs = dict(zip(argv[3::2], argv[4::2], strict=True))
    assert pairs == {"--model": str(gguf), "--model_alias": "smollm2", "--host": "127.0.0.1", "--port": "8123",
                     "--n_ctx": "448", "--n_threads": "3", "--n_threads_batch": "3", "--interrupt_requests": "False"}
    with pytest.raises(TargetError, match="GGUF"):
        launch_template(Target("l", "llama.cpp"), "tiny-random", {}, None, 448)


def test_a_bad_ref_is_named() -> None:
    with pytest.raises(TargetError, match="no-such-ref-xyz"):
        t.resolve_ref("no-such-ref-xyz")
