"""The decode step with the key-split count rounded (the rule before 2026-12-06, round(WAVES * SMs / programs)) or
chosen by choose_splits as it stands (rounded down until 2026-12-07; since then rounded down from two splits up
and to the nearest between one and two: `floor` in the outputs of 2026-12-07a is the plain round-down),
alternating in one process (benchmarks/step_ab.py). Which shapes change: an attention call of T 64-row tiles over
H heads makes T * H programs per split; the header prints both rules' counts for 1-6 tiles. A batch-1 step makes 2
tiles for LLaDA's flash-cache (128 rows), 3 for Dream's (144: the shifted readout adds 16), 1 for a verify pass or
a fast-dllm block.

    splits_ab.py ROUNDS [GEOMETRY] [CELLS]   CELLS: "method:batch,..." or "all" (PYTHONPATH must hold benchmarks/)
"""
import sys

import torch

from flash_dllm.kernels import _scheduled_attention_launcher as launcher
from step_ab import pick_cells, run_ab

CELLS = [(m, b, 300) for b in (1, 2, 3) for m in ("flash-cache", "flash-verify", "fast-dllm")]
FLOOR = launcher.choose_splits


def rounded(n_tiles, n_heads, max_kv_len, n_sms):
    programs = n_tiles * n_heads
    if programs == 0:
        return 1
    return max(1, min(round(launcher.WAVES * n_sms / programs), max_kv_len // launcher.MIN_KEYS_PER_SPLIT))


def rule(choose):
    def apply(engine):
        launcher.choose_splits = choose
    return apply


def header(engine) -> str:
    heads, sms = engine.model.config.n_heads, torch.cuda.get_device_properties(0).multi_processor_count
    return "splits by tiles (round/floor): " + " ".join(
        f"{t}:{rounded(t, heads, 1312, sms)}/{FLOOR(t, heads, 1312, sms)}" for t in range(1, 7))


if __name__ == "__main__":
    run_ab(sys.argv[2] if len(sys.argv) > 2 else "dream-7b", {"round": rule(rounded), "floor": rule(FLOOR)},
           pick_cells(CELLS, sys.argv[3] if len(sys.argv) > 3 else "all"), int(sys.argv[1]) if len(sys.argv) > 1 else 2,
           header)
