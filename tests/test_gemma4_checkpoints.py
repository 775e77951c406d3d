"""Gemma 4 checkpoints in Google's QAT layout (compressed-tensors W4A16: symmetric int4 in
groups of 32, an untied lm_head, the per-layer table in bf16 or 4-bit), written by
transformers and compressed-tensors from tiny random models (tests/helpers/gemma4_models.py):
the packing is exact against the library's decompression, the Triton engine matches the
reference engine on the same directory, the tables stay in their stored form, and the
multimodal layout, unused shared-layer K/V and mixtures of experts are handled. Fresh
random weights and prompts every run (the seeds are printed)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("compressed_tensors")
from compressed_tensors.compressors.pack_quantized.base import (  # noqa: E402
    PackedQuantizationCompressor,
)
from compressed_tensors.quantization import QuantizationScheme  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from decider.engines import ScoreJob, load_engine  # noqa: E402
from decider.engines.checkpoints import read_model  # noqa: E402
from decider.engines.gguf_weights import Packed  # noqa: E402
from decider.errors import ConfigError  # noqa: E402
from decider.kernels.qweight import QWeight  # noqa: E402
from helpers.checkpoints import assert_the_multimodal_layout_reads_the_same  # noqa: E402
from helpers.gemma4_models import CONFIGS, write_checkpoint  # noqa: E402
from helpers.seeds import seeded  # noqa: E402
from helpers.tiny import max_diff, rand_branch, rand_ids  # noqa: E402

TOL = 1e-3  # as in test_gemma4: fp32 both sides, different summation orders
LAYOUTS = {  # name -> (config, per-layer table 4-bit, embedding 4-bit (and the head equal))
    "31b-like": ("31b-like", False, False),
    "e2b-like-ple-bf16": ("e2b-like", False, False),
    "e2b-like-emb4": ("e2b-like", True, True),
}


@pytest.fixture(scope="module", params=list(LAYOUTS))
def ckpt(request, tmp_path_factory):
    config, ple_4bit, emb_4bit = LAYOUTS[request.param]
    spec = {**CONFIGS[config], "untied_head": True}
    path = write_checkpoint(tmp_path_factory.mktemp(request.param) / "ckpt", spec,
                            seeded(request.param), ple_4bit=ple_4bit, embeddings_4bit=emb_4bit)
    engine = load_engine("triton", path, 256, device="cpu")
    reference = load_engine("reference", path, 256)
    yield request.param, path, engine, reference
    engine.close()
    reference.close()


def test_label_logits_match_the_reference(ckpt):
    _, _, engine, reference = ckpt
    rng = seeded("prompts")
    jobs = [ScoreJob((2, *rand_ids(rng, n)), tuple(rand_branch(rng, s) for s in (1, 4, 9)))
            for n in (3, 30, 70)]
    got, want = engine.score(jobs), reference.score(jobs)
    assert max(max_diff(g, w) for g, w in zip(got, want)) < TOL


def test_packed_weights_equal_the_librarys_decompression_bit_for_bit(ckpt):
    name, path, _, _ = ckpt
    stored = load_file(path / "model.safetensors")
    scheme = QuantizationScheme.model_validate(json.loads((path / "config.json").read_text())[
        "quantization_config"]["config_groups"]["group_0"])
    model, dense = read_model(path), read_model(path, dense=True)
    modules = {"model.layers.0.self_attn.q_proj": "blk.0.attn_q.weight",
               "model.layers.5.mlp.down_proj": "blk.5.ffn_down.weight", "lm_head": "output.weight"}
    if "e2b" in name:
        modules |= {"model.layers.3.per_layer_input_gate": "blk.3.inp_gate.weight",
                    "model.per_layer_model_projection": "per_layer_model_proj.weight"}
    if name.endswith("emb4"):
        modules |= {"model.embed_tokens_per_layer": "per_layer_token_embd.weight"}
        del modules["lm_head"]  # equal to the embedding: read as the tied head
    for module, gguf_name in modules.items():
        w = model.tensors[gguf_name]
        assert isinstance(w, Packed) and w.group == 32 and w.source == "W4A16-g32", gguf_name
        sd = {k.removeprefix(module + "."): v for k, v in stored.items()
              if k.startswith(module + ".")}
        exact = PackedQuantizationCompressor.decompress(
            {**sd, "weight_scale": sd["weight_scale"].float()}, scheme)["weight"]
        assert np.array_equal(w.dequantize(), exact.numpy()), gguf_name
        assert np.array_equal(dense.tensors[gguf_name], exact.numpy()), gguf_name


def test_the_tables_stay_in_their_stored_form_and_an_equal_head_shares_the_codes(ckpt):
    name, _, engine, _ = ckpt
    model = engine.model
    if name == "e2b-like-ple-bf16":
        assert model.ple_table.dtype == torch.bfloat16  # not widened to the activations
    if name.endswith("emb4"):
        assert isinstance(model.ple_table, QWeight) and model.ple_table.bits == 4
        assert model.output is model.embedding  # one copy of the packed rows
    else:
        assert isinstance(model.output, QWeight) and model.output is not model.embedding


def test_the_multimodal_layout_reads_the_same_without_its_towers(ckpt, tmp_path):
    """model_type gemma4 with a text_config, the vision and audio towers beside the text
    model (left out)."""
    assert_the_multimodal_layout_reads_the_same(
        ckpt[1], tmp_path, "gemma4", ["model.vision_tower.patch.weight",
                                      "model.audio_tower.conv.bias",
                                      "model.embed_audio.embedding_projection.weight"])


def test_k_and_v_a_shared_layer_never_reads_are_left_out(ckpt, tmp_path):
    name, path, _, _ = ckpt
    if "e2b" not in name:
        pytest.skip("31B's layout shares no KV")
    ckpt_dir = shutil.copytree(path, tmp_path / "ckpt")
    stored = load_file(ckpt_dir / "model.safetensors")
    for part in ("k_proj", "v_proj"):
        for suffix in ("weight_packed", "weight_scale", "weight_shape"):
            stored[f"model.layers.7.self_attn.{part}.{suffix}"] = \
                stored[f"model.layers.0.self_attn.{part}.{suffix}"].clone()
    stored["model.layers.7.self_attn.k_norm.weight"] = stored[
        "model.layers.0.self_attn.k_norm.weight"].clone()
    save_file(stored, ckpt_dir / "model.safetensors")
    model = read_model(ckpt_dir)
    assert model.tensors.keys() == read_model(path).tensors.keys()
    assert "blk.7.attn_k.weight" not in model.tensors


def test_a_mixture_of_experts_checkpoint_is_refused_naming_what_the_engine_lacks(ckpt, tmp_path):
    _, path, _, _ = ckpt
    ckpt_dir = shutil.copytree(path, tmp_path / "moe")
    cfg = json.loads((ckpt_dir / "config.json").read_text())
    cfg |= {"enable_moe_block": True, "num_experts": 4, "top_k_experts": 2,
            "moe_intermediate_size": 64}
    (ckpt_dir / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match=r"mixture-of-experts Gemma 4.*no expert router"):
        load_engine("triton", ckpt_dir, 256, device="cpu")
