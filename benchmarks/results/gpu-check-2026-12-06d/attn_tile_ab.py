"""The decode step under two attention tile settings, alternating in one process (benchmarks/step_ab.py; this
script was rewritten onto that helper after its runs, which measured the same way). LLaDA-8B geometry.

    attn_tile_ab.py ROUNDS [CELLS]          64-row tiles everywhere against 128-row tiles everywhere (call1.sh)
    attn_tile_ab.py ROUNDS CELLS --rule     the engine's rule (packing.attention_tile_rows) against 64 everywhere

CELLS: comma-separated method:batch (e.g. flash-cache:8,flash-verify:8), or "all". PYTHONPATH holds benchmarks/."""
import sys

import flash_dllm.engine.block_diffusion as block_diffusion
import flash_dllm.engine.packing as packing
from step_ab import pick_cells, run_ab

CELLS = [("flash-cache", 1, 300), ("flash-verify", 1, 300), ("flash-cache", 8, 80), ("flash-verify", 8, 60),
         ("fast-dllm", 8, 80), ("flash-cache", 32, 30)]
NEVER = 10**9  # more slots than any forward packs: attention_tile_rows never widens


def tiles(rows: int, widen_from: int):
    """Default tile rows, and the slot count from which the rule widens to WIDE_TILE_ROWS."""
    def apply(engine):
        packing.ATTENTION_BLOCK_M, packing.WIDE_TILE_MIN_SLOTS = rows, widen_from
        block_diffusion.ATTENTION_BLOCK_M = rows  # imported by value there (fast-dllm's block steps)
    return apply


if __name__ == "__main__":
    if "--rule" in sys.argv:
        variants = {"all-64": tiles(64, NEVER), "rule": tiles(64, packing.WIDE_TILE_MIN_SLOTS)}
    else:
        variants = {"bm=64": tiles(64, NEVER), "bm=128": tiles(128, NEVER)}
    run_ab("llada-8b", variants, pick_cells(CELLS, sys.argv[2] if len(sys.argv) > 2 else "all"),
           int(sys.argv[1]) if len(sys.argv) > 1 else 2)
