"""compressed-tensors quantization configs: which schemes a checkpoint uses and which
module each applies to, refusing anything that is not int4 weight-only pack-quantized
(other bit widths, float or block/tensor/token strategies, activation or KV-cache
quantization, act-order indices, sparsity, transforms, other formats), with a
ValueError naming the config key."""

from __future__ import annotations

import json
import re


def schemes(qc: dict | None) -> tuple[dict[str, dict], list[str]]:
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


def scheme_of(module: str, classes: tuple[str, ...], groups: dict, ignore: list[str]):
    if any(_matches(module, classes, t) for t in ignore):
        return None
    hits = [g for g in groups.values() if any(_matches(module, classes, t) for t in g["targets"])]
    if len({json.dumps(g["weights"], sort_keys=True) for g in hits}) > 1:
        raise ValueError(f"module {module!r} matches several config groups with different "
                         "weight schemes")
    return hits[0] if hits else None
