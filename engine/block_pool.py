"""KV-cache block ids: a pool with reference counts, an LRU free queue and the prefix-cache hash map.

The model runner owns the KV tensors; this module only hands out block ids. A block is *free* when its
reference count is 0. A free block may still hold a cached prefix (it keeps its hash): it stays findable
until the pool needs a fresh block and evicts it, least recently freed first.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

BlockHash = bytes

# Root of every hash chain. A fixed constant (not os.urandom) so hashes are stable across processes and
# runs; the hash is sha256, so a collision (two different prefixes sharing a block) is not a practical risk.
ROOT_BLOCK_HASH: BlockHash = hashlib.sha256(b"servelab-prefix-cache-v1").digest()


def hash_block_tokens(
    parent_hash: BlockHash | None, token_ids: Sequence[int], extra_keys: bytes | None = None
) -> BlockHash:
    """sha256(parent hash ‖ int64 token ids ‖ extra keys): chained, so a hash names the whole prefix.

    `extra_keys` is where a LoRA id or a cache salt goes when those exist.
    """
    digest = hashlib.sha256(parent_hash if parent_hash is not None else ROOT_BLOCK_HASH)
    digest.update(array("q", token_ids).tobytes())
    if extra_keys:
        digest.update(extra_keys)
    return digest.digest()


_TOKEN_BYTES = array("q").itemsize


def hash_full_blocks(token_ids: Sequence[int], block_size: int, parent: BlockHash | None = None) -> list[BlockHash]:
    """Hashes of every full block of `token_ids`, taken as the blocks that follow the block hashed `parent` (the
    chain's root when None); a partial last block is skipped.

    The same digests as hash_block_tokens block by block, with the token ids packed to bytes once."""
    num_tokens = len(token_ids) // block_size * block_size
    if num_tokens == 0:
        return []
    data = array("q", token_ids if num_tokens == len(token_ids) else token_ids[:num_tokens]).tobytes()
    parent = parent if parent is not None else ROOT_BLOCK_HASH
    sha256 = hashlib.sha256
    if num_tokens == block_size:  # a decode filling one block: the common call
        return [sha256(parent + data).digest()]
    step = block_size * _TOKEN_BYTES
    hashes = []
    for offset in range(0, len(data), step):
        parent = sha256(parent + data[offset : offset + step]).digest()
        hashes.append(parent)
    return hashes


@dataclass(eq=False)
class KVCacheBlock:
    block_id: int
    ref_cnt: int = 0
    block_hash: BlockHash | None = None  # set once the block is full and registered in the prefix cache
    # Links of the free queue; both None when the block is not in it (or is its only element).
    prev_free: KVCacheBlock | None = None
    next_free: KVCacheBlock | None = None

    def __repr__(self) -> str:
        cached = self.block_hash.hex()[:8] if self.block_hash else None
        return f"KVCacheBlock(id={self.block_id}, ref_cnt={self.ref_cnt}, hash={cached})"


class FreeKVCacheBlockQueue:
    """Doubly linked list of free blocks: pop from the head (LRU), append at the tail, O(1) removal."""

    def __init__(self, blocks: Iterable[KVCacheBlock]) -> None:
        self._head: KVCacheBlock | None = None
        self._tail: KVCacheBlock | None = None
        self._members: set[int] = set()
        for block in blocks:
            self.append(block)

    def __len__(self) -> int:
        return len(self._members)

    def __contains__(self, block: KVCacheBlock) -> bool:
        return block.block_id in self._members

    def append(self, block: KVCacheBlock) -> None:
        assert block.block_id not in self._members, f"{block} is already free"
        block.prev_free, block.next_free = self._tail, None
        if self._tail is None:
            self._head = block
        else:
            self._tail.next_free = block
        self._tail = block
        self._members.add(block.block_id)

    def popleft(self) -> KVCacheBlock:
        if self._head is None:
            raise IndexError("no free KV-cache blocks")
        block = self._head
        self.remove(block)
        return block

    def remove(self, block: KVCacheBlock) -> None:
        assert block.block_id in self._members, f"{block} is not free"
        if block.prev_free is None:
            self._head = block.next_free
        else:
            block.prev_free.next_free = block.next_free
        if block.next_free is None:
            self._tail = block.prev_free
        else:
            block.next_free.prev_free = block.prev_free
        block.prev_free = block.next_free = None
        self._members.discard(block.block_id)

    def blocks(self) -> list[KVCacheBlock]:
        """Head (next to evict) to tail."""
        out, block = [], self._head
        while block is not None:
            out.append(block)
            block = block.next_free
        return out


class BlockPool:
    def __init__(self, num_blocks: int, enable_caching: bool) -> None:
        if num_blocks <= 0:
            raise ValueError(f"the KV cache needs at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)
        # One block per hash: when two requests fill identical blocks at once, only the first is registered;
        # the other stays an ordinary block. Block tables never change, so nothing needs deduplication.
        self.cached_block_hash_to_block: dict[BlockHash, KVCacheBlock] = {}

    def get_num_free_blocks(self) -> int:
        return len(self.free_block_queue)

    def get_usage(self) -> float:
        """Fraction of blocks held by requests (cached-but-free blocks count as free)."""
        return 1.0 - self.get_num_free_blocks() / self.num_blocks

    def get_cached_block(self, block_hash: BlockHash) -> KVCacheBlock | None:
        return self.cached_block_hash_to_block.get(block_hash) if self.enable_caching else None

    def cache_full_block(self, block: KVCacheBlock, block_hash: BlockHash) -> None:
        """Register a block whose KV is fully computed under its chained hash."""
        if not self.enable_caching or block.block_hash is not None:
            return
        if block_hash in self.cached_block_hash_to_block:
            return
        block.block_hash = block_hash
        self.cached_block_hash_to_block[block_hash] = block

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Take blocks from the LRU head, evicting any cached prefix they hold."""
        free_queue = self.free_block_queue
        if num_blocks > len(free_queue):
            raise ValueError(f"cannot get {num_blocks} blocks: only {len(free_queue)} free")
        new_blocks = []
        for _ in range(num_blocks):
            block = free_queue.popleft()
            if block.block_hash is not None:
                self._evict(block)
            assert block.ref_cnt == 0, f"{block} was in the free queue with references"
            block.ref_cnt = 1
            new_blocks.append(block)
        return new_blocks

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Take a reference on prefix-cache hits; a hit on a free block pulls it out of the free queue."""
        for block in blocks:
            if block.ref_cnt == 0:
                self.free_block_queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference each; blocks reaching 0 join the free queue's tail in the given order,
        so pass a request's blocks tail first: its longest-prefix blocks are then evicted first."""
        for block in ordered_blocks:
            assert block.ref_cnt > 0, f"double free of {block}"
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.free_block_queue.append(block)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix; refused (False) while any block is in use, as in vLLM."""
        if self.get_num_free_blocks() != self.num_blocks:
            return False
        for block in self.blocks:
            block.block_hash = None
        self.cached_block_hash_to_block.clear()
        return True

    def _evict(self, block: KVCacheBlock) -> None:
        if block.block_hash is None:
            return
        if self.cached_block_hash_to_block.get(block.block_hash) is block:
            del self.cached_block_hash_to_block[block.block_hash]
        block.block_hash = None
