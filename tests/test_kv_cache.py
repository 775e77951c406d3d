"""The Triton engine's KV cache: writes by position, as a CUDA graph makes them (padded
passes, a ring wrapped inside one write), against the plain rule of what each slot must
hold; and a snapshot restored is the cache as it was."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from decider.engines.kv_cache import KVCache

WINDOW, N_CTX = 8, 64
LAYOUT = [(True, 1, 2), (False, 1, 2)]  # a sliding layer, a full one


def write_chunk(cache: KVCache, tokens: int, padding: int) -> None:
    """tokens at the next positions, then `padding` of columns.py's (position 0); each
    token's keys and values its position + 1 (never 0, which an unwritten slot holds)."""
    pos = torch.cat([torch.arange(cache.length, cache.length + tokens),
                     torch.zeros(padding, dtype=torch.int64)]).to(torch.int32)
    value = torch.where(torch.arange(len(pos)) < tokens, pos + 1, -7).float()
    kv = value[:, None, None].expand(-1, 1, 2)
    for layer in range(len(LAYOUT)):
        cache.write(layer, kv, -kv, pos)
    cache.advance(tokens)


def expected(filled: int, slots: int) -> list[int]:
    """Each slot's position: the newest written there, -1 if none."""
    held = [-1] * slots
    for p in range(filled):
        held[p % slots] = p
    return held


@given(st.lists(st.tuples(st.integers(1, 20), st.integers(0, 12)), min_size=1, max_size=5))
def test_each_slot_holds_the_newest_position_written_there_and_padding_none(chunks):
    cache = KVCache(LAYOUT, N_CTX, WINDOW, torch.float32, "cpu")
    for tokens, padding in chunks:
        if cache.length + tokens <= N_CTX:
            write_chunk(cache, tokens, padding)
    for layer, slots in ((0, WINDOW), (1, N_CTX)):
        k, v, pos = cache.read(layer, N_CTX)
        assert pos.tolist() == expected(cache.length, slots)
        written = pos >= 0
        assert torch.equal(k[written, 0, 0], (pos[written] + 1).float())
        assert torch.equal(v[written], -k[written])


def test_a_restored_snapshot_is_the_cache_as_it_was():
    cache = KVCache(LAYOUT, N_CTX, WINDOW, torch.float32, "cpu")
    write_chunk(cache, 11, 5)
    saved = cache.snapshot()
    before = [[t.clone() for t in cache.read(layer, N_CTX)] for layer in range(2)]
    write_chunk(cache, 20, 0)
    cache.restore(saved)
    assert cache.length == 11
    for layer in range(2):  # what a read sees: the filled slots (position >= 0)
        (k, v, pos), (k0, v0, pos0) = cache.read(layer, N_CTX), before[layer]
        assert torch.equal(pos, pos0)
        assert torch.equal(k[pos >= 0], k0[pos0 >= 0]) and torch.equal(v[pos >= 0], v0[pos0 >= 0])
