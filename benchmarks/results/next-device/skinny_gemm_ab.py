"""Our skinny-GEMM kernels in the step, in one process, alternating (step_ab.run_ab): "cublas" (every projection
through cuBLAS), "split-k" (the output and down projections by the selector's choice: cuBLAS or split-K partials
the next norm sums; gate/up through cuBLAS then the activation kernel), "auto" (both selectors: the gate/up
projection may also run fused with its activation). Before timing, layer 0's projections are checked against
cuBLAS at 128 rows; after, the choices the selectors made are printed.

    PYTHONPATH must hold benchmarks/ (source benchmarks/device_env.sh);  skinny_gemm_ab.py [ROUNDS] [GEOMETRY] [CELLS]
"""
import os
import sys

import torch

from flash_dllm.kernels import _gate_up_select as gate_up
from flash_dllm.kernels import _split_k_select as split_k
from flash_dllm.kernels.gate_up_silu import gate_up_silu_reference
from step_ab import pick_cells, run_ab

_ITERATIONS = int(os.environ.get("ITERATIONS", "0"))  # overrides every cell's count when set
CELLS = [(method, batch, _ITERATIONS or iterations) for method, batch, iterations in
         [("flash-cache", 1, 300), ("flash-verify", 1, 300), ("fast-dllm", 1, 300), ("flash-cache", 8, 80)]]
_active = []


def setting(split_k_choice, gate_up_choice):
    def apply(engine):
        while _active:
            _active.pop().__exit__(None, None, None)
        for family, choice in ((split_k.FAMILY, split_k_choice), (gate_up.FAMILY, gate_up_choice)):
            if choice is not None:
                forcing = family.forced(choice)
                forcing.__enter__()
                _active.append(forcing)
    return apply


def projections_agree(engine) -> str:
    """Layer 0's O, down and gate/up+activation at 128 rows: the auto choice against cuBLAS."""
    layer, ops = engine.model.layers[0], engine.ops
    out = []
    for name, weight in (("o", layer.w_o), ("down", layer.w_down)):
        x = torch.randn(128, weight.shape[1], device="cuda", dtype=weight.dtype)
        expected = torch.nn.functional.linear(x, weight).float()
        got = ops.into_norm(x, weight)
        got = got.sum(0) if got.dim() == 3 else got.float()
        out.append(f"{name} max rel err {((got - expected).abs().max() / expected.abs().max()).item():.2e} "
                   f"({ops.into_norm.bound_choice(x, weight)})")
    x = torch.randn(128, layer.w_gate_up.shape[1], device="cuda", dtype=layer.w_gate_up.dtype)
    expected = gate_up_silu_reference(x, layer.w_gate_up).float()
    got = ops.gate_up(x, layer.w_gate_up).float()
    out.append(f"gate/up max rel err {((got - expected).abs().max() / expected.abs().max()).item():.2e} "
               f"({ops.gate_up.bound_choice(x, layer.w_gate_up)})")
    return "; ".join(out)


if __name__ == "__main__":
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    geometry = sys.argv[2] if len(sys.argv) > 2 else "llada-8b"
    cells = pick_cells(CELLS, sys.argv[3] if len(sys.argv) > 3 else "all")
    run_ab(geometry, {"cublas": setting(split_k.CUBLAS, gate_up.CUBLAS), "split-k": setting(None, gate_up.CUBLAS),
                      "auto": setting(None, None)}, cells, rounds, header=projections_agree)
    for family in (split_k.FAMILY, gate_up.FAMILY):
        for (forcing, _, key), choice in family.choices.items():
            if forcing.choice is None:
                print("chosen", family.label, key[1:], choice, flush=True)
