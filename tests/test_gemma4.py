"""The Triton engine on tiny random Gemma 4 GGUF models (tests/helpers/gemma4_models.py: E2B's,
31B's and E4B's layouts), against transformers' Gemma4ForCausalLM in fp32 on the same
file; and each way Gemma 4 differs from Gemma 3, done the Gemma 3 way, shown to move the
label logits far past the tolerance. Fresh random weights and prompts every run (the
seeds are printed)."""

from __future__ import annotations

import dataclasses
import weakref

import pytest
import torch

from decider.bench.random_gemma4 import write_gemma4
from decider.engines import ScoreJob, load_engine
from decider.engines.gemma4 import Gemma4
from decider.engines.gguf_weights import GGUFModel
from decider.engines.passes import lay_out
from decider.errors import ConfigError
from decider.kernels.fused import rope_tables
from helpers.gemma4_models import CONFIGS, VOCAB, WINDOW, kv_bytes
from helpers.seeds import seeded
from helpers.tiny import max_diff, rand_branch, rand_ids

# fp32 in both engines, different summation orders: up to 4e-5 measured on these models
# (logits up to ~30, the softcap); a Gemma 3 habit left in moves them by 1e-1 or more
TOL = 1e-3
WRONG = 0.05  # what each mutation below must move some logit by, at least


@pytest.fixture(scope="module", params=list(CONFIGS))
def tiny(request, tmp_path_factory):
    """(name, path, engine, reference, a batch of jobs, the reference's results on it)."""
    spec = CONFIGS[request.param]
    rng = seeded(request.param)
    path = write_gemma4(tmp_path_factory.mktemp("g4") / f"{request.param}.gguf", rng,
                        window=WINDOW, vocab=VOCAB, **spec)
    engine = load_engine("triton", path, 256, device="cpu")
    reference = load_engine("reference", path, 256)
    # prefixes short and long (where the pairs full layers keep still would turn)
    batch = [ScoreJob((2, *rand_ids(rng, n)), tuple(rand_branch(rng, s) for s in (1, 4, 9)))
             for n in (3, 30, 120)]
    yield request.param, path, engine, reference, batch, reference.score(batch)
    engine.close()
    reference.close()


def test_label_logits_match_the_reference(tiny):
    _, _, engine, _, batch, want = tiny
    assert max(max_diff(g, w) for g, w in zip(engine.score(batch), want)) < TOL


def test_the_reference_asks_stop_before_each_job_and_skips_the_stopped(tiny):
    _, _, _, reference, batch, want = tiny
    asked, error = [], TimeoutError("past its deadline")

    def stop(i):
        asked.append(i)
        return error if i == 1 else None

    got = reference.score(batch, stop)
    assert asked == [0, 1, 2] and got[1] is error
    assert max(max_diff(g, w) for g, w in zip(got[::2], want[::2])) == 0


@pytest.mark.parametrize("n_batch", [7, 512])  # prefix chunks shorter than the window, or none
@pytest.mark.parametrize("length", [WINDOW - 1, WINDOW + 1, 3 * WINDOW])
def test_sliding_window_edges_and_the_cache_of_shared_layers(tiny, length, n_batch):
    """Jobs through the KV cache in chunks: a shared layer reads its donor's cache as it
    was before the chunk, and the chunk's own keys."""
    _, path, _, reference, _, _ = tiny
    engine = load_engine("triton", path, 256, device="cpu", n_batch=n_batch)
    rng = seeded("prompts")
    job = ScoreJob((2, *rand_ids(rng, length - 4)), (rand_branch(rng, 3), rand_branch(rng, 1)))
    [got], [want] = engine.score([job]), reference.score([job])
    assert max_diff(got, want) < TOL


def test_shared_layers_allocate_no_cache_and_the_memory_is_the_computed_size(tiny):
    name, _, engine, _, _, _ = tiny
    spec = CONFIGS[name]
    first_shared = spec["layers"] - spec.get("shared_kv", 0)
    assert [k is None for k in engine.cache.k] == [i >= first_shared
                                                   for i in range(spec["layers"])]
    assert engine.info.memory["kv"] == kv_bytes(spec, 256)


def test_shared_layers_compute_the_rows_read_alone(tiny):
    """No later layer reads a shared layer's other tokens: it computes the trie nodes'
    rows alone (the batch's logits above hold), and a prefix chunk's pass none at all."""
    name, path, engine, *_ = tiny
    first_shared = CONFIGS[name]["layers"] - CONFIGS[name].get("shared_kv", 0)
    seen: dict[int, list[int]] = {}
    hooks = [b.register_forward_pre_hook(lambda m, args: seen.setdefault(m.index, []).append(
        len(args[0]))) for b in engine.model.blocks]
    chunked = load_engine("triton", path, 256, device="cpu", n_batch=16)
    hooks += [b.register_forward_pre_hook(lambda m, args: seen.setdefault(-1 - m.index, [])
                                          .append(len(args[0]))) for b in chunked.model.blocks]
    rng = seeded("prompts")
    job = ScoreJob((2, *rand_ids(rng, 40)), (rand_branch(rng, 3), rand_branch(rng, 1)))
    try:
        engine.score([job])
        chunked.score([job])
    finally:
        for h in hooks:
            h.remove()
    [one] = lay_out([job], 512, WINDOW).passes
    assert 0 < len(one.rows) < one.tokens
    assert [seen[i] for i in range(len(engine.model.blocks))] == [
        [one.tokens] if i < first_shared else [len(one.rows)]
        for i in range(len(engine.model.blocks))]
    # through the cache: prefix chunks without rows skip the shared layers
    passes = lay_out([job], 16, WINDOW).passes
    assert sum(not p.rows for p in passes) >= 2
    assert [seen[-1 - i] for i in range(len(chunked.model.blocks))] == [
        [p.tokens for p in passes] if i < first_shared else [len(p.rows) for p in passes
                                                             if p.rows]
        for i in range(len(chunked.model.blocks))]


def test_a_pass_keeps_no_layers_kv_past_it_but_the_donors(tiny):
    """A layer's K/V is freed (written to the cache first, through it) once the next
    layer has begun, unless a shared layer reads it: a pass's memory does not grow with
    its layers (31B's layout keeps none). The loop's variable holds the last layer's K/V
    into the next layer, so each layer checks those before the one before it."""
    name, path, engine, *_ = tiny
    donors = engine.model.cfg.donors()
    assert donors == ({4, 3} if name == "e2b-like" else {5, 4} if name == "e4b-like" else set())
    chunked = load_engine("triton", path, 256, device="cpu", n_batch=16)
    kept, late = {}, []

    def after(block, args, out):
        if out[2] is not None:
            kept[block.index] = weakref.ref(out[2][0])

    def before(block, args):
        late.extend((block.index, j) for j, k in kept.items()
                    if j < block.index - 1 and j not in donors and k() is not None)

    hooks = [h for e in (engine, chunked) for b in e.model.blocks
             for h in (b.register_forward_hook(after), b.register_forward_pre_hook(before))]
    rng = seeded("prompts")
    job = ScoreJob((2, *rand_ids(rng, 40)), (rand_branch(rng, 3), rand_branch(rng, 1)))
    try:
        engine.score([job])
        chunked.score([job])  # through the cache: the non-donors write as they finish
    finally:
        for h in hooks:
            h.remove()
    assert len(kept) == len(engine.model.blocks) - CONFIGS[name].get("shared_kv", 0)
    assert late == []


# -- each Gemma 4 difference, done the Gemma 3 way ---------------------------------------


def assert_moved(engine, tiny) -> None:
    """Some label logit or logsumexp of the fixture's batch off the reference's by more
    than WRONG (decisions may flip)."""
    *_, batch, want = tiny
    moved = max(abs(float(a) - float(b)) for g, w in zip(engine.score(batch), want)
                for gb, wb in zip(g, w) for gn, wn in zip(gb, wb)
                for a, b in [*zip(gn.logits, wn.logits), (gn.logsumexp or 0, wn.logsumexp or 0)])
    print(f"the mutation moved the logits by {moved}")
    assert moved > WRONG


def test_a_norm_with_plus_one_is_caught(tiny):
    engine = load_engine("triton", tiny[1], 256, device="cpu")
    for name, buf in engine.model.named_buffers():
        if name.endswith("norm"):
            buf.add_(1.0)  # Gemma 3's 1 + w
    assert_moved(engine, tiny)


def test_full_rope_on_full_layers_is_caught(tiny):
    """Every frequency pair of the full layers rotating, as default RoPE would."""
    engine = load_engine("triton", tiny[1], 256, device="cpu")
    cfg = engine.model.cfg
    assert cfg.rotated == cfg.head_dims[1] // 8  # a quarter of the pairs turn
    engine.model.cos_global, engine.model.sin_global = rope_tables(256, cfg.head_dims[1],
                                                                   cfg.rope_global)
    assert_moved(engine, tiny)


def test_a_shared_layer_computing_its_own_kv_is_caught(tiny):
    """The shared layers of E4B's layout keep k/v tensors in the file: reading the model
    with no layers shared makes them compute and attend to their own K/V."""
    name, path = tiny[:2]
    if not CONFIGS[name].get("shared_kv_tensors"):
        pytest.skip(f"{name} keeps no K/V tensors on its shared layers")
    engine = load_engine("triton", path, 256, device="cpu")
    gg = GGUFModel.read(path)
    own = dataclasses.replace(gg, meta={**gg.meta, "gemma4.attention.shared_kv_layers": 0})
    engine.model = Gemma4(own, torch.float32, 256).eval()
    engine.cache = type(engine.cache)(engine.model.kv_layout(), 256, WINDOW, torch.float32,
                                      "cpu")
    assert_moved(engine, tiny)


def test_the_softcap_after_the_logsumexp_is_caught(tiny, monkeypatch):
    engine = tiny[2]
    model = engine.model
    cap = model.softcap

    def late(h, out=None):  # the logsumexp of the raw logits, softcapped afterwards
        monkeypatch.setattr(model, "softcap", None)
        lse = cap * torch.tanh(torch.logsumexp(model.head(h), -1) / cap)
        monkeypatch.setattr(model, "softcap", cap)
        return lse if out is None else out.copy_(lse)

    monkeypatch.setattr(model, "logsumexp", late)
    assert_moved(engine, tiny)


def test_a_scaled_attention_is_caught(tiny, monkeypatch):
    """Gemma 3's head_dim^-0.5 on the scores instead of Gemma 4's 1.0."""
    import decider.engines.gemma4 as g4

    engine = tiny[2]
    plain = g4.attend
    monkeypatch.setattr(g4, "attend", lambda q, k, v, lo, end, scale, **kw: plain(
        q, k, v, lo, end, q.shape[-1] ** -0.5, **kw))
    assert_moved(engine, tiny)


# -- what the engine refuses -------------------------------------------------------------


def test_a_mixture_of_experts_is_refused_naming_what_the_engine_lacks(tmp_path):
    path = write_gemma4(tmp_path / "moe.gguf", seeded("moe"), layers=6, pattern=6,
                        experts=(4, 2, 64))
    for name, options in (("triton", {"device": "cpu"}), ("reference", {})):
        with pytest.raises(ConfigError, match=r"mixture-of-experts Gemma 4.*no expert router "
                           r"and no grouped expert matmuls.*engine 'llama'"):
            load_engine(name, path, 256, **options)


def test_a_layer_pattern_that_is_not_stored_is_refused(tmp_path):
    """The layer kinds are read from the file, never assumed."""
    import gguf

    path = write_gemma4(tmp_path / "m.gguf", seeded("pattern"), layers=6, pattern=6)
    reader = gguf.GGUFReader(str(path))
    gg = GGUFModel.read(path)
    meta = {k: v for k, v in gg.meta.items() if k != "gemma4.attention.sliding_window_pattern"}
    with pytest.raises(ValueError, match="sliding_window_pattern must give the kind of each"):
        Gemma4(dataclasses.replace(gg, meta=meta))
    assert "gemma4.attention.sliding_window_pattern" in reader.fields
