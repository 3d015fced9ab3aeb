"""Is the NN weight layout slower for fast-dllm's 32-row step? On an H100 on 2026-12-07 fast-dllm's batch-1 step
(7.38 ms) was slower than flash-cache's 128-row step (7.18), where on 2026-12-05 (before the layout) it was
7.16-7.19 and on the H200 table it is the faster of the two. The layout was A/B'd at 128 and 48 rows only.
One process, alternating: gate/up and LM head as loaded ("TN") against stored transposed ("NN", what Engine does
on compute capability >= 9), fast-dllm and flash-cache at batch 1.

    PYTHONPATH must hold benchmarks/ (source benchmarks/device_env.sh);  layout_fast_dllm_ab.py [ROUNDS] [GEOMETRY]
"""
import sys

import torch

from step_ab import run_ab

CELLS = [("fast-dllm", 1, 400), ("flash-cache", 1, 400)]


def layout(nn: bool):
    def apply(engine):
        model = engine.model
        for layer in model.layers:
            if layer.moe is None and layer.w_gate_up is not None:
                w = layer.w_gate_up
                layer.w_gate_up = w.t().contiguous().t() if nn else w.contiguous()
        if model.lm_head is not model.embed:
            model.lm_head = model.lm_head.t().contiguous().t() if nn else model.lm_head.contiguous()
        torch.cuda.empty_cache()
        assert model.layers[0].w_gate_up.is_contiguous() != nn
    return apply


if __name__ == "__main__":
    run_ab(sys.argv[2] if len(sys.argv) > 2 else "llada-8b", {"TN": layout(False), "NN": layout(True)}, CELLS,
           int(sys.argv[1]) if len(sys.argv) > 1 else 2)
