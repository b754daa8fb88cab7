import numpy as np
import pytest

from engine.tokenizer import get_tokenizer
from workloads.mixes import load_mix
from workloads.prefix import assign_prefix_groups, rescale_hash_blocks
from workloads.spec import RequestSpec
from workloads.synthesis import synthesize, word_pool


@pytest.fixture(scope="module")
def tokenizer():
    return get_tokenizer("smollm2-135m")


def raw_ids(tokenizer, prompt):
    return tokenizer(prompt).input_ids


def chat_ids(tokenizer, messages):
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False).input_ids


def test_word_pool_is_large_and_additive(tokenizer):
    pool = word_pool(tokenizer)
    assert len(pool.ids) > 5000 and word_pool(tokenizer) is pool
    words = np.random.default_rng(0).integers(0, len(pool.ids), 300)
    assert raw_ids(tokenizer, pool.text(words)) == pool.ids[words].tolist()


def test_raw_prompts_hit_1000_random_targets_exactly(tokenizer):
    targets = np.random.default_rng(0).integers(1, 768, 1000)
    prompts = synthesize([RequestSpec(int(t), 8) for t in targets], tokenizer, endpoint="completions", seed=1)
    counts = [len(ids) for ids in tokenizer([p.prompt for p in prompts]).input_ids]
    assert counts == targets.tolist()
    assert all(p.messages is None and p.output_len == 8 for p in prompts)


def test_chat_prompts_hit_1000_random_targets_exactly(tokenizer):
    targets = np.random.default_rng(1).integers(31, 768, 1000)
    prompts = synthesize([RequestSpec(int(t), 8) for t in targets], tokenizer, endpoint="chat", seed=1)
    assert [len(chat_ids(tokenizer, p.messages)) for p in prompts] == targets.tolist()
    assert all(p.prompt is None and p.messages[-1]["role"] == "user" for p in prompts)


def test_long_prompts_are_exact_too(tokenizer):
    targets = [4096, 16384, 32768]
    raw = synthesize([RequestSpec(t, 1) for t in targets], tokenizer, seed=2)
    assert [len(raw_ids(tokenizer, p.prompt)) for p in raw] == targets
    chat = synthesize([RequestSpec(t, 1) for t in targets], tokenizer, endpoint="chat", seed=2)
    assert [len(chat_ids(tokenizer, p.messages)) for p in chat] == targets


def test_below_the_chat_template_minimum_is_clamped_and_recorded_or_an_error(tokenizer):
    specs = [RequestSpec(5, 1), RequestSpec(40, 1)]
    short, normal = synthesize(specs, tokenizer, endpoint="chat")
    assert short.input_len == len(chat_ids(tokenizer, short.messages)) == 30  # SmolLM2's template overhead
    assert short.extra["requested_input_len"] == 5 and "requested_input_len" not in normal.extra
    with pytest.raises(ValueError, match="input_len 5 is below the chat prompt's minimum of 30"):
        synthesize(specs, tokenizer, endpoint="chat", too_short="error")


def test_salt_and_seed_control_prefix_sharing(tokenizer):
    specs = [RequestSpec(64, 1), RequestSpec(64, 1)]
    a = synthesize(specs, tokenizer, seed=0, salt="run")
    assert [p.prompt for p in a] == [p.prompt for p in synthesize(specs, tokenizer, seed=0, salt="run")]
    assert a[0].prompt != a[1].prompt
    other_seed = synthesize(specs, tokenizer, seed=1, salt="run")
    fresh_salt = synthesize(specs, tokenizer, seed=0)
    for other in (other_seed, fresh_salt):
        for mine, theirs in zip(a, other, strict=True):
            assert raw_ids(tokenizer, mine.prompt)[:4] != raw_ids(tokenizer, theirs.prompt)[:4]
    assert fresh_salt[0].extra["salt"] != synthesize(specs, tokenizer, seed=0)[0].extra["salt"]


def shared_prefix_len(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_equal_hash_ids_share_exactly_their_blocks(tokenizer):
    specs = [
        RequestSpec(40, 1, prefix_ids=[7, 8, 9]),
        RequestSpec(45, 1, prefix_ids=[7, 8, 10]),
        RequestSpec(20, 1, prefix_ids=[11, 8]),
    ]
    prompts = synthesize(specs, tokenizer, seed=0, salt="s", block_size=16)
    ids = [raw_ids(tokenizer, p.prompt) for p in prompts]
    assert [len(i) for i in ids] == [40, 45, 20]
    assert shared_prefix_len(ids[0], ids[1]) == 32  # blocks 7 and 8
    assert shared_prefix_len(ids[0], ids[2]) == 0


def test_mooncake_replay_at_a_small_block_size(tokenizer):
    specs = rescale_hash_blocks(load_mix("mooncake-conversation")[:40], target_block_size=16)
    prompts = synthesize(specs, tokenizer, endpoint="completions", seed=0, salt="m")
    ids = [raw_ids(tokenizer, p.prompt) for p in prompts]
    assert [len(i) for i in ids] == [s.input_len for s in specs]
    for i in range(1, len(specs)):
        common = shared_prefix_len(specs[0].prefix_ids, specs[i].prefix_ids)
        assert shared_prefix_len(ids[0], ids[i]) >= min(common * 16, len(ids[i]), len(ids[0]))


def test_prefix_groups_share_the_system_prompt(tokenizer):
    specs = assign_prefix_groups([RequestSpec(300, 1) for _ in range(12)], num_groups=3, prefix_len=100, seed=0)
    raw = synthesize(specs, tokenizer, seed=0, salt="g")
    ids = [raw_ids(tokenizer, p.prompt) for p in raw]
    for i in range(len(specs)):
        for j in range(i):
            same = specs[i].prefix_group == specs[j].prefix_group
            assert (shared_prefix_len(ids[i], ids[j]) >= 100) == same
    chat = synthesize(specs, tokenizer, endpoint="chat", seed=0, salt="g")
    assert [len(chat_ids(tokenizer, p.messages)) for p in chat] == [300] * 12
    by_group = {}
    for spec, prompt in zip(specs, chat, strict=True):
        by_group.setdefault(spec.prefix_group, set()).add(prompt.messages[0]["content"])
    assert all(len(systems) == 1 for systems in by_group.values()) and len(by_group) == 3


def test_a_short_request_shares_the_start_of_its_group_prompt(tokenizer):
    specs = [RequestSpec(300, 1, prefix_group=0, prefix_len=100), RequestSpec(60, 1, prefix_group=0, prefix_len=59)]
    ids = [raw_ids(tokenizer, p.prompt) for p in synthesize(specs, tokenizer, seed=0, salt="x")]
    assert [len(i) for i in ids] == [300, 60] and shared_prefix_len(ids[0], ids[1]) == 59
