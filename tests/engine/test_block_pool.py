import pytest

from engine.block_pool import (
    ROOT_BLOCK_HASH,
    BlockPool,
    FreeKVCacheBlockQueue,
    KVCacheBlock,
    hash_block_tokens,
    hash_full_blocks,
)


def test_hash_chain_names_the_whole_prefix() -> None:
    a = hash_block_tokens(None, [1, 2, 3, 4])
    assert a == hash_block_tokens(ROOT_BLOCK_HASH, [1, 2, 3, 4])  # stable, root is explicit
    assert a != hash_block_tokens(None, [1, 2, 3, 5])
    b = hash_block_tokens(a, [5, 6, 7, 8])
    # Same tokens behind a different parent: a different hash.
    assert b != hash_block_tokens(hash_block_tokens(None, [9, 9, 9, 9]), [5, 6, 7, 8])
    assert hash_block_tokens(a, [5, 6, 7, 8], extra_keys=b"salt") != b
    assert len(a) == 32


def test_hash_full_blocks_skips_the_partial_tail_and_continues_a_chain() -> None:
    tokens = list(range(10))
    hashes = hash_full_blocks(tokens, 4)
    assert len(hashes) == 2
    assert hashes == [hash_block_tokens(None, [0, 1, 2, 3]), hash_block_tokens(hashes[0], [4, 5, 6, 7])]
    assert hash_full_blocks([4, 5, 6, 7, 8], 4, parent=hashes[0]) == hashes[1:]  # the chain's continuation alone


def test_free_queue_fifo_and_o1_removal() -> None:
    blocks = [KVCacheBlock(i) for i in range(4)]
    queue = FreeKVCacheBlockQueue(blocks)
    queue.remove(blocks[2])
    assert [b.block_id for b in queue.blocks()] == [0, 1, 3]
    assert queue.popleft().block_id == 0
    queue.append(blocks[0])
    assert [b.block_id for b in queue.blocks()] == [1, 3, 0]
    assert len(queue) == 3 and blocks[2] not in queue
    for _ in range(3):
        queue.popleft()
    with pytest.raises(IndexError):
        queue.popleft()


def test_freed_blocks_keep_their_prefix_until_evicted_least_recently_freed_first() -> None:
    pool = BlockPool(4, enable_caching=True)
    first = pool.get_new_blocks(2)
    second = pool.get_new_blocks(2)
    hashes = [hash_block_tokens(None, [i]) for i in range(4)]
    for block, block_hash in zip(first + second, hashes, strict=True):
        pool.cache_full_block(block, block_hash)
    pool.free_blocks(reversed(first))  # tail first: block 1 is evicted before block 0
    pool.free_blocks(reversed(second))
    assert pool.get_num_free_blocks() == 4 and pool.get_usage() == 0.0
    assert pool.get_cached_block(hashes[0]) is first[0]  # still a hit while free

    (evicted,) = pool.get_new_blocks(1)
    assert evicted is first[1]
    assert evicted.block_hash is None and pool.get_cached_block(hashes[1]) is None
    assert pool.get_cached_block(hashes[0]) is first[0]

    pool.touch([second[0]])  # a hit on a free block takes it out of the free queue
    assert second[0].ref_cnt == 1 and pool.get_num_free_blocks() == 2
    assert [b.block_id for b in pool.free_block_queue.blocks()] == [first[0].block_id, second[1].block_id]


def test_touch_shares_a_block_and_double_free_is_caught() -> None:
    pool = BlockPool(2, enable_caching=True)
    (block,) = pool.get_new_blocks(1)
    pool.touch([block])
    assert block.ref_cnt == 2
    pool.free_blocks([block])
    assert block.ref_cnt == 1 and pool.get_num_free_blocks() == 1
    pool.free_blocks([block])
    with pytest.raises(AssertionError):
        pool.free_blocks([block])


def test_one_block_per_hash_and_no_caching_when_disabled() -> None:
    pool = BlockPool(3, enable_caching=True)
    a, b = pool.get_new_blocks(2)
    h = hash_block_tokens(None, [7])
    pool.cache_full_block(a, h)
    pool.cache_full_block(b, h)  # an identical block filled concurrently stays unregistered
    assert pool.get_cached_block(h) is a and b.block_hash is None

    off = BlockPool(2, enable_caching=False)
    (c,) = off.get_new_blocks(1)
    off.cache_full_block(c, h)
    assert off.get_cached_block(h) is None and c.block_hash is None


def test_get_new_blocks_refuses_more_than_free() -> None:
    pool = BlockPool(2, enable_caching=False)
    with pytest.raises(ValueError, match="only 2 free"):
        pool.get_new_blocks(3)


def test_reset_prefix_cache_only_when_every_block_is_free() -> None:
    pool = BlockPool(2, enable_caching=True)
    (block,) = pool.get_new_blocks(1)
    h = hash_block_tokens(None, [1])
    pool.cache_full_block(block, h)
    assert pool.reset_prefix_cache() is False
    pool.free_blocks([block])
    assert pool.reset_prefix_cache() is True
    assert pool.get_cached_block(h) is None and block.block_hash is None
