"""Label scoring math against direct computations on random logits."""

import numpy as np
import pytest

from decider.engines.base import NodeLogits, label_trie
from decider.scoring import Candidates, answer_log_probs, build_candidates, label_mass


def fake_tokenize(vocab: dict[str, list[int]]):
    return lambda text: vocab[text]


def test_a_label_that_prefixes_another_gets_the_terminator():
    tok = fake_tokenize({" yes": [5], " yes please": [5, 9], " no": [7]})
    cands = build_candidates([[" yes"], [" yes please"], [" no"]], tok, end=(1,))
    assert dict(zip(cands.sequences, cands.owner)) == {(5, 1): 0, (5, 9): 1, (7,): 2}


def test_surface_forms_with_the_same_tokens_count_once():
    tok = fake_tokenize({" yes": [5], " Yes": [5], " no": [7]})
    cands = build_candidates([[" yes", " Yes"], [" no"]], tok, end=(1,))
    assert cands.sequences == ((5,), (7,))


def random_result(rng, cands: Candidates, vocab_lse: float = 30.0):
    """Random raw logits at every trie node, as an engine would return them."""
    return tuple(
        NodeLogits(path, ids, rng.normal(0, 3, len(ids)).astype(np.float32),
                   vocab_lse if path == () else None)
        for path, ids in sorted(label_trie(cands.sequences).items(), key=lambda kv: len(kv[0]))
    )


def test_trie_scores_match_a_direct_product_of_stepwise_softmaxes(rng):
    # answers 0: two surface forms, one multi-token; 1: shares its first token with 0
    cands = Candidates(((3, 4), (6,), (3, 8, 2)), (0, 0, 1))
    result = random_result(rng, cands)
    nodes = {n.path: n for n in result}

    def step(path, token):
        n = nodes[path]
        p = np.exp(n.logits.astype(np.float64))
        return p[n.token_ids.index(token)] / p.sum()

    p34 = step((), 3) * step((3,), 4)
    p6 = step((), 6)
    p382 = step((), 3) * step((3,), 8) * step((3, 8), 2)
    lp = answer_log_probs(cands, result, 2)
    np.testing.assert_allclose(np.exp(lp), [p34 + p6, p382], rtol=1e-12)
    assert np.exp(lp).sum() == pytest.approx(1.0, abs=1e-12)


def test_label_mass_is_the_full_vocabulary_share_of_the_first_tokens():
    cands = Candidates(((3,), (6,)), (0, 1))
    root = NodeLogits((), (3, 6), np.array([1.0, 2.0], np.float32), logsumexp=4.0)
    assert label_mass((root,)) == pytest.approx(np.exp(1 - 4) + np.exp(2 - 4))
    assert answer_log_probs(cands, (root,), 2) == pytest.approx(
        np.log(np.exp([1.0, 2.0]) / np.exp([1.0, 2.0]).sum()))
