"""Two small-kernel changes of 2026-12-07 against the code before them, alternating in one process
(benchmarks/step_ab.py); the same tokens either way:
  * Flash-Cache's tracked positions by a sorted int64 top-k (before) or an unsorted float32 one (now);
  * the final norm after two index_select gathers of the LM head's rows (before) or gathering them itself (now).
`topk-ab.txt` is this script's first run under its earlier name, topk_ab.py (the top-k alone; cut off after one
cell by its time limit).

    small_kernels_ab.py ROUNDS [GEOMETRY]      (PYTHONPATH must hold benchmarks/)
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


class GatherThenNorm:
    """The norm as it ran before: the rows gathered by index_select first."""

    def __init__(self, norm):
        self.norm = norm

    def __call__(self, residual, update, weight, eps, out=None, inplace=False, rows=None):
        if rows is not None:
            residual, update = residual.index_select(0, rows), update.index_select(0, rows)
        return self.norm(residual, update, weight, eps, out, inplace)


def use(tracked, before: bool):
    def apply(engine):
        device_plan.FlashCache._tracked = tracked
        norm = engine.ops.norm
        norm = norm.norm if isinstance(norm, GatherThenNorm) else norm
        engine.ops.norm = GatherThenNorm(norm) if before else norm
    return apply


if __name__ == "__main__":
    run_ab(sys.argv[2] if len(sys.argv) > 2 else "llada-8b",
           {"before": use(int64_tracked, True), "now": use(FLOAT32, False)}, CELLS,
           int(sys.argv[1]) if len(sys.argv) > 1 else 2)
