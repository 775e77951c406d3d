"""Write the labelled datasets (decider/bench/datasets.py) as JSONL, <name>.train.jsonl and
<name>.test.jsonl in a folder, one {"text", "question", "gold"} line an item, and print
each split's count and class balance. The archives are fetched into the dataset cache
($DECIDER_DATA_DIR, else ~/.cache/decider/datasets) the first time.

    python scripts/datasets.py OUT_DIR [NAME ...]      # all datasets when none is named
"""

import sys
from collections import Counter
from pathlib import Path

from decider.bench.datasets import NAMES, load, write_jsonl

if len(sys.argv) < 2:
    sys.exit(f"usage: python scripts/datasets.py OUT_DIR [NAME ...]; names: {', '.join(NAMES)}")
out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
for name in sys.argv[2:] or NAMES:
    dataset = load(name)
    print(f"{name}: {dataset.question['question']} ({dataset.question['type']})")
    for which in ("train", "test"):
        path = out / f"{name}.{which}.jsonl"
        count = write_jsonl(dataset, which, path)
        balance = Counter(item.gold for item in dataset.split(which))
        share = {label: balance[label] / count for label in dataset.labels}
        if len(share) <= 10:
            shares = ", ".join(f"{label} {s:.1%}" for label, s in share.items())
        else:  # one line, not 77
            low, high = min(share, key=share.get), max(share, key=share.get)
            shares = (f"{len(share)} labels, from {share[low]:.1%} ({low}) "
                      f"to {share[high]:.1%} ({high})")
        print(f"  {which}: {count} items -> {path}\n    {shares}")
