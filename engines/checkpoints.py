"""Model files in, one GGUFModel out: a .gguf file, or a Hugging Face checkpoint directory
(config.json + *.safetensors) of a Gemma 3 or Gemma 4 text model, dense or
compressed-tensors W4A16, so that the engines' model code is the same for both.

A checkpoint directory is mapped by its architecture's HFText (hf_config.py,
hf_gemma4.py): tensor names to GGUF's (vision and audio towers left out), norm weights
shifted as GGUF stores them, the config written into the GGUF metadata keys the model
config reads, and what the model code derives checked against the checkpoint. Weights:
dense bf16/fp16/fp32 -> fp32 exactly (their stored type kept in GGUFModel.dtypes);
compressed-tensors "pack-quantized" int4 (pack_quantized.py, under the schemes of
quant_schemes.py) -> Packed("q4") exactly, no requantising. A stored lm_head equal to
the embedding is the tied head; Gemma 4 keeps one that differs as output.weight.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from .gguf_weights import GGUFModel, Weight, same_weight
from .hf_config import OTHER_TOWERS, TEXT_PREFIXES, Gemma3HF, HFText
from .pack_quantized import PackQuantized
from .quant_schemes import scheme_of, schemes
from .safetensors_file import SafeTensor, read_safetensors

_PACKED_PARTS = ("weight_packed", "weight_scale", "weight_zero_point", "weight_shape")


def read_model(path: str | Path, dense: bool = False) -> GGUFModel:
    """A .gguf file (GGUFModel.read) or a checkpoint directory. dense: every tensor
    dequantized to fp32, by a path independent of the packing (the reference)."""
    path = Path(path)
    if path.is_dir():
        return read_checkpoint(path, dense)
    return GGUFModel.read(path, dense=dense)


def read_text_model(path: Path, engine: str, dense: bool = False):
    """read_model, the model class of its architecture and its config, or a ConfigError
    saying why `engine` cannot load it."""
    from decider.errors import ConfigError

    from .architectures import model_class

    try:
        model = read_model(path, dense)
        cls = model_class(model.arch, model.path)
        return model, cls, cls.config_class.from_gguf(model)
    except ValueError as e:  # a model this engine cannot run: say which and why
        raise ConfigError(f"engine {engine!r} cannot load {path}: {e}", model_path=path) from e


def has_tokenizer(model: GGUFModel) -> bool:
    """Whether the model's file holds a tokenizer: a GGUF's tokenizer.ggml.model, a
    checkpoint directory's tokenizer.json."""
    if model.path.is_dir():
        return (model.path / "tokenizer.json").is_file()
    return "tokenizer.ggml.model" in model.meta


def _text_name(module: str, arch: HFText) -> str | None:
    """HF module name -> GGUF tensor name (without .weight); None: left out (another
    tower, or a tensor the model does not use)."""
    if module.startswith(OTHER_TOWERS):
        return None
    if module == "lm_head":
        return "output"
    for p in TEXT_PREFIXES:
        if module.startswith(p):
            rest = module.removeprefix(p)
            break
    else:
        raise ValueError(f"tensor {module!r} is not a {arch.family} text model tensor")
    m = re.fullmatch(r"layers\.(\d+)\.(.+)", rest)
    if m and arch.unused(int(m[1]), m[2]):
        return None
    name = arch.layer_name(int(m[1]), m[2]) if m else arch.global_name(rest)
    if name is None:
        raise ValueError(f"tensor {module!r} is not a {arch.family} text model tensor")
    return name


def _modules(files: list[Path]) -> dict[str, dict[str, SafeTensor]]:
    """Every stored tensor, grouped by module: {module: {part: tensor}}."""
    modules: dict[str, dict[str, SafeTensor]] = {}
    for f in files:
        for name, t in read_safetensors(f).items():
            module, _, part = name.rpartition(".")
            if part == "layer_scalar":  # a buffer, stored without ".weight"
                module, part = name, "weight"
            if part not in ("weight", *_PACKED_PARTS):
                if module.startswith(OTHER_TOWERS):
                    continue
                raise ValueError(f"tensor {name!r} ({part}) is not a weight this engine holds "
                                 "(no biases, act-order indices or activation scales)")
            if part in modules.setdefault(module, {}):
                raise ValueError(f"tensor {name!r} is stored twice ({f.name})")
            modules[module][part] = t
    return modules


def read_checkpoint(path: Path, dense: bool = False) -> GGUFModel:
    """A Hugging Face text model checkpoint directory as a GGUFModel (see the module doc)."""
    if not (path / "config.json").is_file():
        raise ValueError(f"{path} is a directory without a config.json")
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{path} holds no *.safetensors files")
    raw = json.loads((path / "config.json").read_text())
    arch = hf_text(raw, path)
    qc = raw.get("quantization_config") or (raw.get("text_config") or {}).get(
        "quantization_config")
    groups, ignore = schemes(qc)

    tensors: dict[str, Weight] = {}
    dtypes: dict[str, str] = {}
    for module, parts in _modules(files).items():
        gname = _text_name(module, arch)
        if gname is None:
            continue
        if "weight" in parts and len(parts) > 1:
            raise ValueError(f"module {module!r} stores both a dense weight and "
                             f"{', '.join(sorted(set(parts) - {'weight'}))}")
        if "weight" in parts:
            w: Weight = parts["weight"].float32().reshape(parts["weight"].shape or (1,))
            if gname.endswith("norm") and arch.norm_shift:
                w = arch.norm_shift + w  # in fp32, as transformers computes it
            dtypes[gname + ".weight"] = parts["weight"].dtype
        else:
            scheme = scheme_of(module, arch.classes(module), groups, ignore)
            if scheme is None:
                raise ValueError(f"tensor {module}.weight_packed is pack-quantized, but no "
                                 "config group of quantization_config targets it (or it is "
                                 "ignored)")
            q = PackQuantized(module, parts, scheme["weights"])
            w = q.dense() if dense else q.packed_form()
        tensors[gname + ".weight"] = w
    tensors |= arch.extra_tensors()
    _check_shapes(tensors, arch)
    head = tensors.get("output.weight")
    if head is not None and same_weight(head, tensors["token_embd.weight"]):
        del tensors["output.weight"]  # the tied head, stored once more
    elif head is not None and arch.tied:
        raise ValueError("lm_head differs from model.embed_tokens; this engine reads the "
                         f"head tied to the embedding, as {arch.family} ties it")
    model = GGUFModel(path, arch.arch, arch.meta(), tensors, dtypes)
    arch.check(model)
    return model


def _check_shapes(tensors: dict[str, Weight], arch: HFText) -> None:
    want = arch.expected_shapes()
    want["output"] = want["token_embd"]
    missing = sorted(set(want) - {"output"} - {n.removesuffix(".weight") for n in tensors})
    if missing:
        raise ValueError(f"{arch.path}: tensors missing for this {arch.family} config: "
                         f"{', '.join(missing[:6])}{' ...' if len(missing) > 6 else ''}")
    for name, w in tensors.items():
        key = name.removesuffix(".weight")
        if key in want and tuple(w.shape) != want[key]:
            raise ValueError(f"tensor {name!r} has shape {tuple(w.shape)}; the config gives "
                             f"{want[key]}")


def hf_text(raw: dict, path: Path) -> HFText:
    """The mapping of the config.json's architecture."""
    kind = raw.get("model_type", "")
    if kind.startswith("gemma4"):
        from .hf_gemma4 import Gemma4HF

        return Gemma4HF(raw, path)
    return Gemma3HF(raw, path)
