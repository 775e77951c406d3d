"""The attention kernel against its torch reference, in the Triton interpreter on the
CPU (fp32 operands, small shapes drawn fresh each run inside each case's regime, the
tolerance of test_kernels_triton.py): packed token trees, sliding windows, a cached
prefix, growing scores, split key ranges, and queries for some tokens of a pass alone."""

from __future__ import annotations

import pytest
import torch

from decider.kernels import arrivals
from decider.kernels.attention import attend
from decider.kernels.attention_triton import attention_triton
from helpers.interpreted import triton  # noqa: F401 (first: it turns the interpreter on)
from helpers.qweights import close
from helpers.trees import draw, forest_inputs

pytestmark = pytest.mark.usefixtures("rng")


# (tree sizes, branchy, Hq, Hkv, D, window, cached positions): windows below and above the
# sequence lengths; 70-token trees span two 64-query blocks and several key blocks.
ATTENTION_CASES = {
    "chains-gqa4-d256": ([5, 70, 33], False, 4, 1, 256, None, 0),
    "chains-window16-gqa4-d256": ([5, 70, 33], False, 4, 1, 256, 16, 0),
    "trees-window1000-gqa1-d64": ([40, 1, 70], True, 2, 2, 64, 1000, 0),
    "trees-window7-gqa1-d64": ([70, 9], True, 2, 2, 64, 7, 0),
    "cached-prefix-trees-gqa4-d256": ([3, 50], True, 4, 1, 256, None, 40),
    "cached-ring-window32-gqa2-d72": ([20, 6], True, 4, 2, 72, 32, 32),
    "block-edges-window2-d64": ([65, 33, 64], False, 2, 1, 64, 2, 0),
    # Gemma 4's full layers
    "cached-prefix-chains-gqa8-d512": ([20, 9], False, 8, 1, 512, None, 12),
}


@pytest.mark.parametrize("case", ATTENTION_CASES)
def test_attention_matches_the_reference(case):
    sizes, branchy, hq, hkv, d, window, cached = ATTENTION_CASES[case]
    sizes = [n + draw(0, 3) for n in sizes]
    args, kwargs = forest_inputs(sizes, branchy, hq, hkv, d, window, cached)
    close(attention_triton(*args, d ** -0.5, **kwargs), attend(*args, d ** -0.5, **kwargs))


def test_attention_reads_q_k_v_as_views_of_one_fused_output():
    args, kwargs = forest_inputs([30, 9], True, 4, 1, 64, 8)
    q, k, v, lo, end = args
    heads = torch.cat([q, k, v], 1)  # [T, 6, D]: q, k and v side by side, as QKV gives them
    got = attention_triton(heads[:, :4], heads[:, 4:5], heads[:, 5:], lo, end, 0.125, **kwargs)
    close(got, attend(q, k, v, lo, end, 0.125, **kwargs))


# (branchy, Hq, Hkv, D, blocks): groups of 3 and 8 query heads put a query block's first
# token at any offset in a key block (8 with 16-row blocks: one before a 16-key block's
# last key, the last such block that needs its mask)
GROWING_KEYS = {
    "chains-gqa4": (False, 4, 1, 64, None),
    "trees-gqa4-blocks16": (True, 4, 1, 64, (16, 16, 4, 1)),
    "trees-gqa3": (True, 6, 2, 40, None),
    "chains-gqa8-blocks16": (False, 8, 1, 32, (16, 16, 4, 1)),
}


@pytest.mark.parametrize("case", GROWING_KEYS)
def test_attention_as_the_scores_grow_along_the_keys(case):
    """Keys growing in size along the pass: each row's max rises by a lot at some key
    blocks, by a little at others, and key blocks with and without a mask alternate."""
    branchy, hq, hkv, d, blocks = GROWING_KEYS[case]
    args, kwargs = forest_inputs([150, 90], branchy, hq, hkv, d, None)
    q, k, v, lo, end = args
    k *= torch.linspace(0.1, 8.0, len(k))[:, None, None] ** 2
    close(attention_triton(*args, d ** -0.5, blocks=blocks, **kwargs),
          attend(*args, d ** -0.5, **kwargs))


# (sizes, branchy, Hq, Hkv, blocks with splits): a long chain's last query blocks read
# every key, so their keys go to several programs; short trees beside it stay whole
SPLIT_KEYS = {
    "chain-two-parts": ([150], False, 4, 1, (16, 16, 4, 1, 2, 1)),
    "chain-three-parts-min-two": ([150], False, 4, 1, (16, 16, 4, 1, 3, 2)),
    "trees-four-parts-gqa2": ([97, 5, 40], True, 4, 2, (32, 16, 4, 1, 4, 1)),
    "short-trees-never-split": ([20, 9, 30], True, 2, 1, (16, 16, 4, 1, 4, 8)),
}


@pytest.mark.parametrize("case", SPLIT_KEYS)
def test_attention_splits_long_blocks_keys_over_programs(case):
    sizes, branchy, hq, hkv, blocks = SPLIT_KEYS[case]
    args, kwargs = forest_inputs([n + draw(0, 3) for n in sizes], branchy, hq, hkv, 32, None)
    got = attention_triton(*args, 0.2, blocks=blocks, **kwargs)
    close(got, attend(*args, 0.2, **kwargs))
    assert torch.equal(attention_triton(*args, 0.2, blocks=blocks, **kwargs), got)
    assert not arrivals.counts(got.device).any()  # left at zero for the next launch


def test_attention_refuses_splits_with_a_cache():
    args, kwargs = forest_inputs([8], False, 2, 1, 32, None, 4)
    with pytest.raises(ValueError, match="splits need no cache"):
        attention_triton(*args, 0.2, blocks=(16, 16, 4, 1, 2, 1), **kwargs)


def test_attention_refuses_heads_that_do_not_group():
    (q, k, v, lo, end), _ = forest_inputs([4], False, 3, 2, 64, None)
    with pytest.raises(ValueError, match="multiple"):
        attention_triton(q, k, v, lo, end, 0.1)


# (case of ATTENTION_CASES or SPLIT_KEYS, blocks)
SOME_QUERIES = {
    "chains-window16-gqa4-d256": None, "trees-window7-gqa1-d64": None,
    "cached-ring-window32-gqa2-d72": None, "cached-prefix-chains-gqa8-d512": None,
    "block-edges-window2-d64": (16, 16, 4, 1), "chain-two-parts": (16, 16, 4, 1, 2, 1),
}


@pytest.mark.parametrize("case", SOME_QUERIES)
def test_attention_of_some_tokens_alone_is_theirs_in_the_whole(case):
    """Queries for some tokens of the pass alone (a Gemma 4 shared layer's output rows),
    ascending, the last repeated as the CUDA graphs pad them: the rows of the whole."""
    if case in SPLIT_KEYS:
        sizes, branchy, hq, hkv, _ = SPLIT_KEYS[case]
        d, window, cached = 32, None, 0
    else:
        sizes, branchy, hq, hkv, d, window, cached = ATTENTION_CASES[case]
    args, kwargs = forest_inputs([n + draw(0, 3) for n in sizes], branchy, hq, hkv, d,
                                 window, cached)
    q, k, v, lo, end = args
    picked = sorted(torch.randperm(len(q))[:draw(1, len(q))].tolist())
    rows = torch.tensor(picked + picked[-1:] * draw(0, 3), dtype=torch.int32)
    want = attend(*args, 0.2, **kwargs)[rows.long()]
    close(attend(q[rows.long()], k, v, lo, end, 0.2, rows=rows, **kwargs), want)
    close(attention_triton(q[rows.long()], k, v, lo, end, 0.2, rows=rows,
                           blocks=SOME_QUERIES[case], **kwargs), want)
    assert not arrivals.counts(q.device).any()


def test_attention_refuses_rows_that_do_not_match_the_queries():
    (q, k, v, lo, end), _ = forest_inputs([9], False, 2, 1, 32, None)
    with pytest.raises(ValueError, match=r"\[rows, Hq, D\]"):
        attention_triton(q[:3], k, v, lo, end, 0.1, rows=torch.tensor([1, 2], dtype=torch.int32))
    with pytest.raises(ValueError, match="int32"):
        attention_triton(q[:2], k, v, lo, end, 0.1, rows=torch.tensor([1, 2]))
