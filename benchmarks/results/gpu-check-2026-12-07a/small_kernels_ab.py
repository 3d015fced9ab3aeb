"""Flash-Cache's tracked positions chosen by a sorted int64 top-k (the previous code) or an unsorted float32 one
(engine/device_plan.py now), alternating in one process (benchmarks/step_ab.py). Same positions either way.

    topk_ab.py ROUNDS [GEOMETRY]      (PYTHONPATH must hold benchmarks/)
"""
import sys

import torch

from flash_dllm.engine import device_plan
from flash_dllm.engine.device_canvas import NOT_NEW
from step_ab import run_ab

CELLS = [("flash-cache", 1, 400), ("flash-verify", 1, 400), ("flash-cache", 8, 100)]
FLOAT32 = device_plan.FlashCache._tracked


def int64_tracked(self, canvas, chosen):
    far = 1 << 50
    S, L = chosen.shape
    ranks = getattr(self, "int64_ranks", None)  # made once, as the previous code did in __init__
    if ranks is None or ranks.shape != self.attended.shape:
        ranks = self.int64_ranks = (torch.arange(self.attended.shape[1], device=chosen.device) + NOT_NEW
                                    ).expand_as(self.attended).contiguous()
    prio = torch.full((S, L + 1), far, dtype=torch.int64, device=chosen.device)
    prio.scatter_(1, torch.where(self.attended >= 0, self.attended, L), ranks)
    new_pos = torch.where(canvas.newly_rank < NOT_NEW, device_plan.p0_cells(canvas), L)
    prio.scatter_(1, new_pos, canvas.newly_rank)
    prio = prio[:, :L].masked_fill(chosen, far)
    values, index = torch.topk(prio, min(self.track, L), dim=1, largest=False)
    return torch.where(values < far, index, L)


def use(fn):
    def apply(engine):
        device_plan.FlashCache._tracked = fn
    return apply


if __name__ == "__main__":
    run_ab(sys.argv[2] if len(sys.argv) > 2 else "llada-8b", {"int64": use(int64_tracked), "float32": use(FLOAT32)},
           CELLS, int(sys.argv[1]) if len(sys.argv) > 1 else 2)
