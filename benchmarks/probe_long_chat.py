"""Experiment (#22): does a small model answer the last question of a long chat as well as a fresh one?

Each held-out item of the chosen families is asked after K earlier exchanges (questions of other families with
their right answers, drawn from the training generators with a fixed seed, so every K sees the same tail of the
same history: K=3 is the last three exchanges of K=11). Decoded with the page's default (flash-cache), greedy.

    python3 benchmarks/probe_long_chat.py --model assets/models/tiny-chat --per-family 60 --exchanges 0,3,11
"""
from __future__ import annotations

import argparse
import json
import random
from dataclasses import replace

from flash_dllm.engine.training import data
from flash_dllm.engine.training.evaluate import DECODERS, evaluate_family, load_engine, settings_for
from flash_dllm.engine.training.tasks_base import assistant


def history(seed: int, n: int) -> list[dict]:
    """n earlier exchanges (user, assistant), oldest first, the same for every item of one seed."""
    rng = random.Random(seed)
    messages = []
    for _ in range(n):
        earlier = data.GENERATORS[rng.choice(data.EARLIER_TURN_FAMILIES)](rng, "train")
        messages += [*earlier.messages, assistant(earlier.response)]
    return messages


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="assets/models/tiny-chat")
    ap.add_argument("--families", default="everyday,everyday_word,out_of_scope")
    ap.add_argument("--per-family", type=int, default=60)
    ap.add_argument("--exchanges", default="0,3,11")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    engine = load_engine(args.model, "cpu")
    settings = settings_for(DECODERS["flash-cache"], 128, 32)
    counts = [int(k) for k in args.exchanges.split(",")]
    rows = {}
    for family in args.families.split(","):
        items = data.test_set(family, args.per_family)
        for k in counts:
            cells = []
            for index, item in enumerate(items):  # one history per item, its tail shared across K
                full = history(1000 + index, max(counts))
                cells.append(replace(item, messages=[*(full[len(full) - 2 * k:] if k else []), *item.messages]))
            cell = evaluate_family(engine, cells, settings, batch_size=32)
            rows[f"{family}@{k}"] = {"exact": cell["exact"], "n": cell["n"], "failures": cell["failures"][:5]}
            print(f"{family:>14} after {k:2d} exchanges: {cell['exact']:5.1f} % ({cell['n']} items)", flush=True)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(rows, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
