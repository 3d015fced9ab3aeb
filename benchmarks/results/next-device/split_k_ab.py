"""The output and down projections through cuBLAS only ("cublas") against the selector's choice per problem
("auto": cuBLAS or a split-K config whose partials the next norm sums; kernels/split_k_linear.py), in one
process, alternating (step_ab.run_ab). Before timing, one cached forward per setting checks that the logits
agree to bf16 rounding; after, the choices the selector made are printed.

    PYTHONPATH must hold benchmarks/ (source benchmarks/device_env.sh);  split_k_ab.py [ROUNDS] [GEOMETRY] [CELLS]
"""
import os
import sys

import torch

from flash_dllm.kernels import _split_k_select as select
from step_ab import pick_cells, run_ab

_ITERATIONS = int(os.environ.get("ITERATIONS", "0"))  # overrides every cell's count when set
CELLS = [(method, batch, _ITERATIONS or iterations) for method, batch, iterations in
         [("flash-cache", 1, 300), ("flash-verify", 1, 300), ("fast-dllm", 1, 300), ("flash-cache", 8, 80)]]
_active = []


def setting(choice):
    def apply(engine):
        while _active:
            _active.pop().__exit__(None, None, None)
        if choice is not None:
            forcing = select.forced_skinny_linear(choice)
            forcing.__enter__()
            _active.append(forcing)
    return apply


def projections_agree(engine) -> str:
    """One O and one down projection of layer 0 at 128 rows, cuBLAS against the auto choice, summed."""
    layer = engine.model.layers[0]
    out = []
    for name, weight in (("o", layer.w_o), ("down", layer.w_down)):
        x = torch.randn(128, weight.shape[1], device="cuda", dtype=weight.dtype)
        expected = torch.nn.functional.linear(x, weight).float()
        got = engine.ops.into_norm(x, weight)
        got = got.sum(0) if got.dim() == 3 else got.float()
        out.append(f"{name} max rel err {((got - expected).abs().max() / expected.abs().max()).item():.2e} "
                   f"({engine.ops.into_norm.bound_choice(x, weight)})")
    return "; ".join(out)


if __name__ == "__main__":
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    geometry = sys.argv[2] if len(sys.argv) > 2 else "llada-8b"
    cells = pick_cells(CELLS, sys.argv[3] if len(sys.argv) > 3 else "all")
    run_ab(geometry, {"cublas": setting(select.CUBLAS), "auto": setting(None)}, cells, rounds,
           header=projections_agree)
    for (forcing, _, key), choice in select._CHOICES.items():
        if forcing.choice is None:
            print("chosen", key[1:], choice, flush=True)
