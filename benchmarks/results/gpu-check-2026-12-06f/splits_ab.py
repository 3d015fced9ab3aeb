"""The decode step with the key-split count rounded (the previous rule, round(WAVES * SMs / programs)) or rounded
down (the new one, which never asks for more programs than the SMs hold at once), alternating in one process
(benchmarks/step_ab.py). Only Dream-7B at batch 1 changes (56 programs: 5 splits -> 4).

    splits_ab.py ROUNDS [GEOMETRY]      (PYTHONPATH must hold benchmarks/)
"""
import sys

import torch

from flash_dllm.kernels import _scheduled_attention_launcher as launcher
from step_ab import run_ab

CELLS = [("flash-cache", 1, 300), ("flash-verify", 1, 300), ("fast-dllm", 1, 300)]
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
    return f"batch-1 splits (2 tiles): round {rounded(2, heads, 1312, sms)}, floor {FLOOR(2, heads, 1312, sms)}"


if __name__ == "__main__":
    run_ab(sys.argv[2] if len(sys.argv) > 2 else "dream-7b", {"round": rule(rounded), "floor": rule(FLOOR)}, CELLS,
           int(sys.argv[1]) if len(sys.argv) > 1 else 2, header)
