"""Hugging Face Gemma 3 checkpoints in compressed-tensors W4A16 "pack-quantized" form,
written by the compressed-tensors library itself from a tiny random transformers model:
the packing is exact against the library's own decompression, the Triton engine matches
the reference engine on the same directory, and what cannot be held exactly is refused.
Fresh random weights and prompts every run."""

from __future__ import annotations

import json
import shutil
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("compressed_tensors")
from compressed_tensors.compressors.pack_quantized.base import (
    PackedQuantizationCompressor,
)
from compressed_tensors.quantization import QuantizationScheme
from safetensors.torch import load_file, save_file

from decider.engines import Branch, ScoreJob, load_engine
from decider.engines.checkpoints import read_model
from decider.engines.gguf_weights import Packed
from decider.engines.hf_config import HF_NAMES
from decider.errors import ConfigError, EngineFailure
from helpers.checkpoints import (
    assert_the_multimodal_layout_reads_the_same,
    write_checkpoint,
)
from helpers.seeds import seeded
from helpers.tiny import TOL, VOCAB, max_diff, rand_branch, rand_ids

SCHEMES = {  # name -> (strategy, group_size, symmetric)
    "g32": ("group", 32, True),
    "g128": ("group", 128, True),
    "g32-asym": ("group", 32, False),
    "channel-asym": ("channel", None, False),
}


def edit_config(path, **changes):
    """Copy the checkpoint and change config.json: key "a.b.c" sets a nested value."""
    cfg = json.loads((path / "config.json").read_text())
    for key, value in changes.items():
        *parents, last = key.split(".")
        d = cfg
        for p in parents:
            d = d[p]
        d[last] = value
    (path / "config.json").write_text(json.dumps(cfg))
    return path


@pytest.fixture(scope="module", params=list(SCHEMES))
def ckpt(request, tmp_path_factory):
    strategy, group, symmetric = SCHEMES[request.param]
    path = write_checkpoint(tmp_path_factory.mktemp(request.param),
                            seeded(f"ckpt[{request.param}]"), strategy, group, symmetric)
    engine = load_engine("triton", path, 256, device="cpu")
    reference = load_engine("reference", path, 256)
    yield request.param, path, engine, reference
    engine.close()
    reference.close()


def test_packed_weights_equal_the_librarys_decompression_bit_for_bit(ckpt, monkeypatch):
    scheme_name, path, _, _ = ckpt
    stored = load_file(path / "model.safetensors")
    cfg = json.loads((path / "config.json").read_text())
    scheme = QuantizationScheme.model_validate(
        cfg["quantization_config"]["config_groups"]["group_0"])
    model = read_model(path)
    dense = read_model(path, dense=True)
    packed = 0
    for i in range(6):
        for hf, gg in HF_NAMES.items():
            w = model.tensors[f"blk.{i}.{gg}.weight"]
            module = f"model.layers.{i}.{hf}"
            if not isinstance(w, Packed):
                assert "norm" in gg  # norms stay dense, holding 1 + w
                want = stored[module + ".weight"].float().numpy() + 1
                assert np.array_equal(w, want) and np.array_equal(dense.tensors[
                    f"blk.{i}.{gg}.weight"], want)
                continue
            packed += 1
            sd = {k.removeprefix(module + "."): v for k, v in stored.items()
                  if k.startswith(module + ".")}
            ours = w.dequantize()
            # the library computes in the scale's dtype: with fp32 scales it is exact
            exact = PackedQuantizationCompressor.decompress(
                {**sd, "weight_scale": sd["weight_scale"].float()}, scheme)["weight"]
            assert ours.dtype == np.float32 and np.array_equal(ours, exact.numpy())
            # with its stored bf16 scales it rounds each exact product once, as we would
            native = PackedQuantizationCompressor.decompress(sd, scheme)["weight"]
            assert native.dtype == torch.bfloat16
            assert torch.equal(torch.from_numpy(ours).to(torch.bfloat16), native)
            assert np.array_equal(dense.tensors[f"blk.{i}.{gg}.weight"], ours)
            assert w.group == (SCHEMES[scheme_name][1] or w.shape[1])
    assert packed == 6 * 7
    # without compressed-tensors the reference dequantizes by the format's formula
    monkeypatch.setitem(sys.modules, "compressed_tensors.compressors.pack_quantized.base", None)
    formula = read_model(path, dense=True)
    for name, w in model.tensors.items():
        assert np.array_equal(formula.tensors[name],
                              w.dequantize() if isinstance(w, Packed) else w), name
    emb = model.tensors["token_embd.weight"]  # nn.Embedding is not a Linear target
    assert np.array_equal(emb, stored["model.embed_tokens.weight"].float().numpy())


def test_label_logits_match_the_reference(ckpt, rng):
    _, _, engine, reference = ckpt
    jobs = [ScoreJob((2, *rand_ids(rng, n)), tuple(rand_branch(rng, s) for s in (1, 4, 9)))
            for n in (3, 30, 70)]
    got, want = engine.score(jobs), reference.score(jobs)
    assert max(max_diff(g, w) for g, w in zip(got, want)) < TOL
    assert engine.info.n_vocab == VOCAB and engine.info.n_ctx_train == 4096


def test_the_multimodal_layout_reads_the_same(ckpt, tmp_path):
    """model_type gemma3 with a text_config, a vision tensor beside the text model's."""
    assert_the_multimodal_layout_reads_the_same(
        ckpt[1], tmp_path, "gemma3", ["model.vision_tower.patch.weight"],
        ignore=["lm_head", "re:.*vision_tower.*"])


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("small") / "ckpt", seeded("small"),
                            layers=6)


def copy(small, tmp_path):
    return shutil.copytree(small, tmp_path / "ckpt")


@pytest.mark.parametrize("changes, message", [
    ({"quantization_config.config_groups.group_0.weights.num_bits": 8},
     r"group_0\.weights\.num_bits is 8"),
    ({"quantization_config.config_groups.group_0.weights.strategy": "tensor"},
     r"group_0\.weights\.strategy is 'tensor'"),
    ({"quantization_config.config_groups.group_0.input_activations": {
        "num_bits": 8, "type": "int", "strategy": "token", "dynamic": True, "symmetric": True}},
     r"group_0\.input_activations is .*activation quantization"),
    ({"quantization_config.format": "marlin-24",
      "quantization_config.config_groups.group_0.format": None}, r"format is 'marlin-24'"),
    ({"quantization_config.kv_cache_scheme": {"num_bits": 8, "type": "float"}},
     r"kv_cache_scheme is set"),
    ({"quantization_config.ignore": ["lm_head", "re:.*q_proj"]},
     r"q_proj\.weight_packed is pack-quantized, but no config group"),
    ({"layer_types": ["sliding_attention"] * 6},
     r"layer_types\[5\] is 'sliding_attention'.*full_attention"),
    ({"rope_parameters.sliding_attention.rope_theta": 20000.0}, r"rope_theta.*20000"),
    ({"rope_parameters.full_attention": {"rope_type": "yarn", "factor": 2.0,
                                          "rope_theta": 1e6}}, r"rope_type.*'yarn'"),
    ({"query_pre_attn_scalar": 256}, r"query_pre_attn_scalar is 256.*64"),
    ({"final_logit_softcapping": 30.0}, r"final_logit_softcapping is 30\.0"),
    ({"model_type": "llama"}, r"model_type is 'llama'"),
])
def test_what_cannot_be_held_exactly_is_refused_at_load(small, tmp_path, changes, message):
    path = edit_config(copy(small, tmp_path), **changes)
    for name, options in (("triton", {"device": "cpu"}), ("reference", {})):
        with pytest.raises(ConfigError, match=message):
            load_engine(name, path, 256, **options)


def test_fp32_scales_whose_products_would_round_are_refused(small, tmp_path):
    path = copy(small, tmp_path)
    stored = load_file(path / "model.safetensors")
    key = "model.layers.3.mlp.up_proj.weight_scale"
    stored[key] = stored[key].float() * (1 + 2**-20)  # 24 significant bits: 3 * s rounds
    save_file(stored, path / "model.safetensors")
    with pytest.raises(ConfigError, match=r"layers\.3\.mlp\.up_proj\.weight_scale \(F32\).*round"):
        load_engine("triton", path, 256, device="cpu")
    stored[key] = stored[key].to(torch.bfloat16).float()  # fp32 holding bf16 values: exact
    save_file(stored, path / "model.safetensors")
    assert isinstance(read_model(path).tensors["blk.3.ffn_up.weight"], Packed)


def test_a_tokenizer_json_gives_no_bos_special_tokens_only_when_asked(small, tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    path = copy(small, tmp_path)
    engine = load_engine("triton", path, 256, device="cpu")
    with pytest.raises(EngineFailure, match="holds no tokenizer"):
        engine.tokenize("hello")
    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, "hello": 4, "world": 5,
             "<start_of_turn>": 6}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<bos>", "<start_of_turn>"])
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A",
                                                       special_tokens=[("<bos>", 2)])
    tok.save(str(path / "tokenizer.json"))
    for name, options in (("triton", {"device": "cpu"}), ("reference", {})):
        engine = load_engine(name, path, 256, **options)
        text = "<start_of_turn>hello world"
        assert engine.tokenize(text, special=True) == [6, 4, 5]  # a template's marker
        plain = engine.tokenize(text)  # user text: the markup stays text, unknown words here
        assert 6 not in plain and plain[-2:] == [4, 5]
        engine.close()
    job = ScoreJob((2, 6, 4), (Branch((5,), ((4,), (5,))),))
    assert engine.score([job])[0][0][0].token_ids == (4, 5)


def test_moving_the_model_moves_every_tensor_the_dense_embedding_too(ckpt):
    """A checkpoint's embedding stays dense (not a Linear target): Gemma3.to must move it
    with the packed parts and the buffers (the meta device stands in for a GPU here)."""
    from decider.engines.gemma3 import Gemma3
    from decider.kernels.qweight import QWeight

    model = Gemma3(read_model(ckpt[1])).to(torch.device("meta"))
    assert isinstance(model.embedding, torch.Tensor) and model.embedding.is_meta
    tensors = [t for m in model.modules() if hasattr(m, "parts") for w in m.parts
               for t in ((w.codes, w.scale) if isinstance(w, QWeight) else (w,))]
    tensors += list(model.buffers()) + [model.embed_scale]
    assert tensors and all(t.is_meta for t in tensors)
