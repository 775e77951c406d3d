"""Model files in, one GGUFModel out: a .gguf file, or a Hugging Face Gemma 3 checkpoint
directory (config.json + *.safetensors), dense or compressed-tensors W4A16.

A checkpoint directory becomes what GGUFModel.read gives for a GGUF file, so the engines'
model code is the same for both:
- tensor names: HF's (model.embed_tokens, model.layers.N.self_attn.q_proj, ...; also under
  model.language_model. or language_model.model. in the multimodal layout) -> GGUF's
  (token_embd, blk.N.attn_q, ...); vision tensors are left out;
- norm weights: HF stores w, GGUF (llama.cpp's converter) 1 + w: the 1 is added here, in
  fp32, the precision transformers' Gemma RMSNorm adds it in;
- config: config.json (defaults filled in by transformers' Gemma3TextConfig, as the
  reference engine would) written into the GGUF metadata keys Gemma3Config.from_gguf
  reads; then the facts from_gguf derives rather than reads (every 6th layer full
  attention, local RoPE base 10000, query_pre_attn_scalar) are checked against the
  checkpoint's and a disagreement is refused, naming the key and both values;
- weights: dense bf16/fp16/fp32 -> fp32 exactly; compressed-tensors "pack-quantized" int4
  (group or channel strategy, symmetric or not) -> Packed("q4") exactly, no requantising.

Pack-quantized int4: `weight_packed` int32 [N, K/8], eight 4-bit fields per word, lowest
first, each the signed code q plus 8; `weight_scale` [N, K/group]; asymmetric:
`weight_zero_point` int32 [ceil(N/8), K/group], packed the same way down the rows (zp + 8);
value = (q - zp) * s. The little-endian words' bytes are exactly Packed's q4 codes (column
2k low nibble of byte k, 2k+1 high), u = q + 8, so value = u * s + offset with offset =
-8 * s (symmetric) or -(zp + 8) * s. Both products are exact in fp32 for bf16/fp16 scales
(at most 11 + 4 significant bits); fp32 scales are checked and refused where k * s would
round for some 4-bit k.

Everything else a config can say (other bit widths, float or block/tensor/token
strategies, activation or KV-cache quantization, act-order indices, sparsity, transforms,
other formats) is refused with a ValueError naming the config key or tensor.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from .gemma3 import LOCAL_ROPE_BASE, SLIDING_PATTERN, Gemma3Config
from .gguf_weights import GGUFModel, Packed, Weight

# transformers parameter (after "layers.N.") -> GGUF tensor (after "blk.N.")
HF_NAMES = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm", "input_layernorm": "attn_norm",
    "post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm", "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}
TEXT_PREFIXES = ("model.language_model.", "language_model.model.", "model.")
OTHER_TOWERS = ("vision_tower.", "multi_modal_projector.", "model.vision_tower.",
                "model.multi_modal_projector.")
_LINEAR = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
_PACKED_PARTS = ("weight_packed", "weight_scale", "weight_zero_point", "weight_shape")
_ST_DTYPES = {"F32": "<f4", "F16": "<f2", "BF16": "<u2", "F64": "<f8", "I64": "<i8",
              "I32": "<i4", "I16": "<i2", "I8": "i1", "U8": "u1", "BOOL": "?"}


def read_model(path: str | Path, dense: bool = False) -> GGUFModel:
    """A .gguf file (GGUFModel.read) or a Gemma 3 checkpoint directory. dense: every
    tensor dequantized to fp32, by a path independent of the packing (the reference)."""
    path = Path(path)
    if path.is_dir():
        return read_checkpoint(path, dense)
    return GGUFModel.read(path, dense=dense)


def read_gemma3(path: Path, engine: str, dense: bool = False) -> tuple[GGUFModel, Gemma3Config]:
    """read_model and the Gemma 3 config, or a ConfigError saying why `engine` cannot."""
    from decider.errors import ConfigError

    try:
        model = read_model(path, dense)
        return model, Gemma3Config.from_gguf(model)
    except ValueError as e:  # a model this engine cannot run: say which and why
        raise ConfigError(f"engine {engine!r} cannot load {path}: {e}", model_path=path) from e


def has_tokenizer(model: GGUFModel) -> bool:
    """Whether the model's file holds a tokenizer: a GGUF's tokenizer.ggml.model, a
    checkpoint directory's tokenizer.json."""
    if model.path.is_dir():
        return (model.path / "tokenizer.json").is_file()
    return "tokenizer.ggml.model" in model.meta


# -- safetensors -------------------------------------------------------------------------


class _Tensor:
    """One safetensors tensor: its dtype name and little-endian data (bf16 as uint16)."""

    __slots__ = ("data", "dtype", "name")

    def __init__(self, name: str, dtype: str, data: np.ndarray) -> None:
        self.name, self.dtype, self.data = name, dtype, data

    @property
    def shape(self) -> tuple[int, ...]:
        return self.data.shape

    def float32(self) -> np.ndarray:
        """fp32, exactly (bf16, fp16 and fp32 all fit); other dtypes are refused."""
        if self.dtype == "BF16":
            return (self.data.astype(np.uint32) << 16).view(np.float32)
        if self.dtype in ("F16", "F32"):
            return self.data.astype(np.float32)
        raise ValueError(f"tensor {self.name!r} is {self.dtype}; expected BF16, F16 or F32")

    def ints(self) -> np.ndarray:
        if self.dtype not in ("I32", "I64"):
            raise ValueError(f"tensor {self.name!r} is {self.dtype}; expected I32 or I64")
        return self.data.astype(np.int64)


def read_safetensors(path: Path) -> dict[str, _Tensor]:
    """Every tensor of one .safetensors file (the format is a u64 header length, a JSON
    header of dtype, shape and byte range, then the data), copied out of a memory map."""
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    n = int(raw[:8].view("<u8")[0])
    header = json.loads(raw[8 : 8 + n].tobytes())
    base = 8 + n
    out = {}
    for name, spec in header.items():
        if name == "__metadata__":
            continue
        if spec["dtype"] not in _ST_DTYPES:
            raise ValueError(f"tensor {name!r} in {path.name} has dtype {spec['dtype']}, "
                             "which this reader does not know")
        lo, hi = spec["data_offsets"]
        data = raw[base + lo : base + hi].copy().view(_ST_DTYPES[spec["dtype"]])
        out[name] = _Tensor(name, spec["dtype"], data.reshape(spec["shape"]))
    return out


# -- config ------------------------------------------------------------------------------


def _text_config(cfg: dict, path: Path):
    """The checkpoint's text config, defaults filled in as transformers fills them."""
    from transformers import Gemma3TextConfig

    kind = cfg.get("model_type")
    if kind == "gemma3" and isinstance(cfg.get("text_config"), dict):
        text = dict(cfg["text_config"])
    elif kind == "gemma3_text":
        text = {k: v for k, v in cfg.items() if k != "quantization_config"}
    else:
        raise ValueError(f"{path / 'config.json'}: model_type is {kind!r}; supported: "
                         "'gemma3_text', or 'gemma3' with a text_config")
    text.pop("model_type", None)
    try:
        return Gemma3TextConfig(**text)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path / 'config.json'}: transformers refuses the config: {e}") from e


def _meta(tc) -> dict[str, object]:
    """GGUF metadata keys (as llama.cpp's converter writes them) from the HF config."""
    full = tc.rope_parameters["full_attention"]
    for key in ("sliding_window", "head_dim", "max_position_embeddings"):
        if getattr(tc, key) is None:
            raise ValueError(f"config.json {key} is null; this engine's Gemma 3 needs a value")
    meta: dict[str, object] = {
        "general.architecture": "gemma3",
        "gemma3.context_length": tc.max_position_embeddings,
        "gemma3.embedding_length": tc.hidden_size,
        "gemma3.block_count": tc.num_hidden_layers,
        "gemma3.feed_forward_length": tc.intermediate_size,
        "gemma3.attention.head_count": tc.num_attention_heads,
        "gemma3.attention.head_count_kv": tc.num_key_value_heads,
        "gemma3.attention.key_length": tc.head_dim,
        "gemma3.attention.value_length": tc.head_dim,
        "gemma3.attention.layer_norm_rms_epsilon": tc.rms_norm_eps,
        "gemma3.attention.sliding_window": tc.sliding_window,
        "gemma3.rope.freq_base": full["rope_theta"],
    }
    if full.get("rope_type", "default") == "linear":
        meta["gemma3.rope.scaling.type"] = "linear"
        meta["gemma3.rope.scaling.factor"] = full["factor"]
    if tc.bos_token_id is not None:
        meta["tokenizer.ggml.bos_token_id"] = tc.bos_token_id
    return meta


def _refuse(key: str, got, want) -> None:
    raise ValueError(f"config.json {key} is {got!r}, but this engine's Gemma 3 uses {want!r}")


def check_config(tc, cfg: Gemma3Config) -> None:
    """What from_gguf derives (or the model code assumes) against what the checkpoint says."""
    for i, kind in enumerate(tc.layer_types):
        want = "sliding_attention" if cfg.sliding(i) else "full_attention"
        if kind != want:
            _refuse(f"layer_types[{i}]", kind,
                    f"{want} (every {SLIDING_PATTERN}th layer full attention)")
    if len(tc.layer_types) != cfg.layers:
        _refuse("layer_types (length)", len(tc.layer_types), cfg.layers)
    local = tc.rope_parameters["sliding_attention"]
    if local.get("rope_type", "default") != "default":
        _refuse("rope_parameters.sliding_attention.rope_type", local["rope_type"], "default")
    if float(local["rope_theta"]) != cfg.rope_local:
        _refuse("rope_parameters.sliding_attention.rope_theta (rope_local_base_freq)",
                local["rope_theta"], LOCAL_ROPE_BASE)
    full = tc.rope_parameters["full_attention"]
    if full.get("rope_type", "default") not in ("default", "linear"):
        _refuse("rope_parameters.full_attention.rope_type (rope_scaling)", full["rope_type"],
                "default or linear")
    if float(tc.query_pre_attn_scalar) != cfg.query_pre_attn_scalar:
        _refuse("query_pre_attn_scalar", tc.query_pre_attn_scalar, cfg.query_pre_attn_scalar)
    if tc.vocab_size != cfg.vocab:
        _refuse("vocab_size", tc.vocab_size, f"{cfg.vocab} (the embedding's rows)")
    for key, want in (("attn_logit_softcapping", None), ("final_logit_softcapping", None),
                      ("hidden_activation", "gelu_pytorch_tanh"), ("attention_bias", False),
                      ("use_bidirectional_attention", False), ("tie_word_embeddings", True)):
        got = getattr(tc, key, want)
        if got != want and not (want is False and got is None):
            _refuse(key, got, want)


# -- quantization config -----------------------------------------------------------------


def _schemes(qc: dict | None) -> tuple[dict[str, dict], list[str]]:
    """config_groups (name -> weights args, targets) and the ignore list, after refusing
    anything that is not int4 weight-only pack-quantized."""
    if not qc:
        return {}, []
    key = "quantization_config"
    if qc.get("quant_method") != "compressed-tensors":
        raise ValueError(f"{key}.quant_method is {qc.get('quant_method')!r}; only "
                         "'compressed-tensors' checkpoints are read")
    status = qc.get("quantization_status", "compressed")
    if status != "compressed":
        raise ValueError(f"{key}.quantization_status is {status!r}; expected 'compressed'")
    for part in ("sparsity_config", "transform_config", "kv_cache_scheme"):
        if qc.get(part):
            raise ValueError(f"{key}.{part} is set ({qc[part]!r}); this engine holds int4 "
                             "weight-only quantization and nothing else")
    groups = {}
    for name, group in (qc.get("config_groups") or {}).items():
        at = f"{key}.config_groups.{name}"
        fmt = group.get("format") or qc.get("format")
        if fmt != "pack-quantized":
            raise ValueError(f"{at}.format is {fmt!r}; only 'pack-quantized' is held exactly")
        for act in ("input_activations", "output_activations"):
            if group.get(act) is not None:
                raise ValueError(f"{at}.{act} is {group[act]!r}: activation quantization "
                                 "(W4A16 only: activations stay in float)")
        w = group.get("weights")
        if not w:
            raise ValueError(f"{at}.weights is {w!r}: a group without weight quantization")
        checks = (("num_bits", w.get("num_bits") == 4, "4"),
                  ("type", w.get("type") == "int", "'int'"),
                  ("strategy", w.get("strategy") in ("group", "channel"), "'group' or 'channel'"),
                  ("dynamic", not w.get("dynamic"), "false"),
                  ("actorder", w.get("actorder") in (None, "weight", "static"),
                   "none or 'weight' (no column permutation stored)"),
                  ("block_structure", w.get("block_structure") is None, "null"))
        for field, ok, want in checks:
            if not ok:
                raise ValueError(f"{at}.weights.{field} is {w.get(field)!r}; this engine holds "
                                 f"{want} exactly, nothing else")
        if w["strategy"] == "group" and not (isinstance(w.get("group_size"), int)
                                             and w["group_size"] > 0):
            raise ValueError(f"{at}.weights.group_size is {w.get('group_size')!r}")
        groups[name] = {"weights": w, "targets": list(group.get("targets") or [])}
    return groups, list(qc.get("ignore") or [])


def _matches(name: str, classes: tuple[str, ...], target: str) -> bool:
    """compressed-tensors' matching: "re:" regex on the module name, else the exact name
    or a class name."""
    if target.startswith("re:"):
        return re.match(target.removeprefix("re:"), name) is not None
    return target == name or target in classes


def _scheme_of(module: str, classes: tuple[str, ...], groups: dict, ignore: list[str]):
    if any(_matches(module, classes, t) for t in ignore):
        return None
    hits = [g for g in groups.values() if any(_matches(module, classes, t) for t in g["targets"])]
    if len({json.dumps(g["weights"], sort_keys=True) for g in hits}) > 1:
        raise ValueError(f"module {module!r} matches several config groups with different "
                         "weight schemes")
    return hits[0] if hits else None


# -- pack-quantized int4 -----------------------------------------------------------------


def _nibbles(words: np.ndarray) -> np.ndarray:
    """int32 [..., W] -> the eight 4-bit fields of each word, lowest first: [..., W * 8]."""
    w = words.astype(np.int64) & 0xFFFFFFFF
    return ((w[..., None] >> (4 * np.arange(8))) & 15).reshape(*w.shape[:-1], -1)


class _Quantized:
    """One pack-quantized linear's tensors, checked against its scheme."""

    def __init__(self, module: str, parts: dict[str, _Tensor], weights: dict) -> None:
        self.module, self.weights = module, weights
        self.symmetric = weights.get("symmetric", True)
        missing = {"weight_packed", "weight_scale", "weight_shape"} - parts.keys()
        if not self.symmetric:
            missing |= {"weight_zero_point"} - parts.keys()
        if missing:
            raise ValueError(f"pack-quantized module {module!r} lacks {', '.join(sorted(missing))}")
        if self.symmetric and "weight_zero_point" in parts:
            raise ValueError(f"{module}.weight_zero_point is stored for a symmetric scheme")
        shape = tuple(int(x) for x in parts["weight_shape"].ints())
        if len(shape) != 2:
            raise ValueError(f"{module}.weight_shape is {shape}; expected [rows, cols]")
        self.rows, self.cols = shape
        self.group = weights["group_size"] if weights["strategy"] == "group" else self.cols
        self.packed, self.scale_t = parts["weight_packed"], parts["weight_scale"]
        self.zero_t = parts.get("weight_zero_point")
        if self.packed.dtype != "I32" or self.packed.shape != (self.rows, self.cols // 8) or \
                self.cols % 8 or self.cols % self.group:
            raise ValueError(f"{module}.weight_packed is {self.packed.dtype} {self.packed.shape}; "
                             f"expected I32 [{self.rows}, {self.cols} / 8] in groups of "
                             f"{self.group}")
        self.scale = self.scale_t.float32()
        if self.scale.shape != (self.rows, self.cols // self.group):
            raise ValueError(f"{module}.weight_scale is {self.scale.shape}; expected "
                             f"[{self.rows}, {self.cols // self.group}]")
        if self.zero_t is not None and (self.zero_t.dtype != "I32" or self.zero_t.shape != (
                -(-self.rows // 8), self.scale.shape[1])):
            raise ValueError(f"{module}.weight_zero_point is {self.zero_t.dtype} "
                             f"{self.zero_t.shape}; expected I32 [ceil({self.rows} / 8), "
                             f"{self.scale.shape[1]}]")

    def zero_codes(self) -> np.ndarray:
        """The unsigned zero point zp + 8 per group, [rows, groups] (8: symmetric)."""
        if self.zero_t is None:
            return np.full(self.scale.shape, 8, np.int64)
        z = _nibbles(self.zero_t.data.T)  # [groups, ceil(rows / 8) * 8]: down the rows
        return z[:, : self.rows].T

    def packed_form(self) -> Packed:
        s = self.scale
        # bf16/fp16 scales hold at most 11 significant bits, so k * s (k < 16) is exact in
        # fp32; fp32 scales are checked
        if self.scale_t.dtype == "F32" and not all(
                np.array_equal((np.float32(k) * s).astype(np.float64), k * s.astype(np.float64))
                for k in range(3, 16, 2)):  # odd k suffice: k = 2^j * odd only shifts
            raise ValueError(f"{self.module}.weight_scale (F32) has scales whose 4-bit "
                             "multiples round in fp32: not held exactly")
        offset = -(self.zero_codes().astype(np.float32) * s)  # exact: checked just above
        codes = self.packed.data.view(np.uint8).reshape(self.rows, self.cols // 2)
        src = f"W4A16-g{self.group}{'' if self.symmetric else '-asym'}"
        return Packed("q4", codes, s, offset, self.group, src)

    def dense(self) -> np.ndarray:
        """fp32 [rows, cols]: compressed-tensors' own decompression where it is installed
        (scales upcast to fp32, so its arithmetic is exact), else the format's formula
        from the int32 words; neither goes through the Packed layout."""
        try:
            import torch
            from compressed_tensors.compressors.pack_quantized.base import (
                PackedQuantizationCompressor,
            )
            from compressed_tensors.quantization import QuantizationScheme
        except ImportError:
            q = _nibbles(self.packed.data).astype(np.float64) - 8  # signed codes
            zp = self.zero_codes().astype(np.float64) - 8
            w = (q.reshape(self.rows, -1, self.group) - zp[..., None]) * self.scale[..., None]
            return w.reshape(self.rows, self.cols).astype(np.float32)
        sd = {"weight_packed": torch.from_numpy(self.packed.data),
              "weight_scale": torch.from_numpy(self.scale),
              "weight_shape": torch.tensor([self.rows, self.cols])}
        if self.zero_t is not None:
            sd["weight_zero_point"] = torch.from_numpy(self.zero_t.data)
        scheme = QuantizationScheme(targets=["Linear"], weights=self.weights)
        w = PackedQuantizationCompressor.decompress(sd, scheme)["weight"]
        return w.to(torch.float32).numpy()


# -- the checkpoint ----------------------------------------------------------------------


def _gguf_name(module: str) -> str | None:
    """HF module name -> GGUF tensor name (without .weight); None: not a text tensor."""
    if module.startswith(OTHER_TOWERS) or module == "lm_head":
        return None
    for p in TEXT_PREFIXES:
        if module.startswith(p):
            rest = module.removeprefix(p)
            break
    else:
        raise ValueError(f"tensor {module!r} is not a Gemma 3 text model tensor")
    if rest == "embed_tokens":
        return "token_embd"
    if rest == "norm":
        return "output_norm"
    m = re.fullmatch(r"layers\.(\d+)\.(.+)", rest)
    if m and m[2] in HF_NAMES:
        return f"blk.{m[1]}.{HF_NAMES[m[2]]}"
    raise ValueError(f"tensor {module!r} is not a Gemma 3 text model tensor")


def _classes(module: str) -> tuple[str, ...]:
    """The module's class names as compressed-tensors matches targets against them."""
    if module.endswith("embed_tokens"):
        return ("Gemma3TextScaledWordEmbedding", "Embedding", "Module")
    if module.endswith(_LINEAR) or module == "lm_head":
        return ("Linear", "Module")
    return ("Gemma3RMSNorm", "Module")


def _expected_shapes(c: Gemma3Config) -> dict[str, tuple[int, int] | tuple[int]]:
    shapes: dict = {"token_embd": (c.vocab, c.hidden), "output_norm": (c.hidden,)}
    for i in range(c.layers):
        p = f"blk.{i}."
        shapes |= {p + "attn_q": (c.heads * c.head_dim, c.hidden),
                   p + "attn_k": (c.kv_heads * c.head_dim, c.hidden),
                   p + "attn_v": (c.kv_heads * c.head_dim, c.hidden),
                   p + "attn_output": (c.hidden, c.heads * c.head_dim),
                   p + "ffn_gate": (c.ffn, c.hidden), p + "ffn_up": (c.ffn, c.hidden),
                   p + "ffn_down": (c.hidden, c.ffn)}
        for n in ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm"):
            shapes[p + n] = (c.hidden,)
        shapes[p + "attn_q_norm"] = shapes[p + "attn_k_norm"] = (c.head_dim,)
    return shapes


def read_checkpoint(path: Path, dense: bool = False) -> GGUFModel:
    """A Hugging Face Gemma 3 checkpoint directory as a GGUFModel (see the module doc)."""
    if not (path / "config.json").is_file():
        raise ValueError(f"{path} is a directory without a config.json")
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{path} holds no *.safetensors files")
    raw = json.loads((path / "config.json").read_text())
    tc = _text_config(raw, path)
    qc = raw.get("quantization_config") or (raw.get("text_config") or {}).get(
        "quantization_config")
    groups, ignore = _schemes(qc)

    stored: dict[str, _Tensor] = {}
    for f in files:
        for name, t in read_safetensors(f).items():
            if name in stored:
                raise ValueError(f"tensor {name!r} is stored twice ({f.name})")
            stored[name] = t
    modules: dict[str, dict[str, _Tensor]] = {}
    for name, t in stored.items():
        module, _, part = name.rpartition(".")
        if part not in ("weight", *_PACKED_PARTS):
            if module.startswith(OTHER_TOWERS):
                continue
            raise ValueError(f"tensor {name!r} ({part}) is not a weight this engine holds "
                             "(no biases, act-order indices or activation scales)")
        modules.setdefault(module, {})[part] = t

    tensors: dict[str, Weight] = {}
    head = None
    for module, parts in modules.items():
        gname = _gguf_name(module)
        if gname is None and module != "lm_head":
            continue  # the vision tower of a multimodal checkpoint
        if "weight" in parts and len(parts) > 1:
            raise ValueError(f"module {module!r} stores both a dense weight and "
                             f"{', '.join(sorted(set(parts) - {'weight'}))}")
        if "weight" in parts:
            w: Weight = parts["weight"].float32()
            if gname is not None and gname.endswith("norm"):
                w = 1 + w  # fp32, as transformers' Gemma RMSNorm computes 1 + w
        else:
            scheme = _scheme_of(module, _classes(module), groups, ignore)
            if scheme is None:
                raise ValueError(f"tensor {module}.weight_packed is pack-quantized, but no "
                                 "config group of quantization_config targets it (or it is "
                                 "ignored)")
            q = _Quantized(module, parts, scheme["weights"])
            w = q.dense() if dense else q.packed_form()
        if module == "lm_head":
            head = w
        else:
            tensors[gname + ".weight"] = w

    meta = _meta(tc)
    model = GGUFModel(path, "gemma3", meta, tensors)
    want = _expected_shapes(Gemma3Config(
        vocab=tc.vocab_size, hidden=tc.hidden_size, layers=tc.num_hidden_layers,
        heads=tc.num_attention_heads, kv_heads=tc.num_key_value_heads, head_dim=tc.head_dim,
        ffn=tc.intermediate_size, eps=tc.rms_norm_eps, window=tc.sliding_window or 1,
        query_pre_attn_scalar=1.0, rope_global=1.0))
    missing = sorted(set(want) - {n.removesuffix(".weight") for n in tensors})
    if missing:
        raise ValueError(f"{path}: tensors missing for a {tc.num_hidden_layers}-layer Gemma 3: "
                         f"{', '.join(missing[:6])}{' ...' if len(missing) > 6 else ''}")
    for name, w in tensors.items():
        if tuple(w.shape) != want[name.removesuffix(".weight")]:
            raise ValueError(f"tensor {name!r} has shape {tuple(w.shape)}; the config gives "
                             f"{want[name.removesuffix('.weight')]}")
    check_config(tc, Gemma3Config.from_gguf(model))
    if head is not None:  # Gemma ties the head to the embedding: a stored copy must equal it
        same = (np.array_equal(head, tensors["token_embd.weight"]) if isinstance(head, np.ndarray)
                else isinstance(tensors["token_embd.weight"], Packed) and all(
                    np.array_equal(getattr(head, f), getattr(tensors["token_embd.weight"], f))
                    for f in ("codes", "scale", "offset")))
        if not same:
            raise ValueError("lm_head differs from model.embed_tokens; this engine reads the "
                             "head tied to the embedding, as Gemma 3 ties it")
    return model
