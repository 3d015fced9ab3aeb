"""Everything the tenth and eleventh sessions built for the batch-1 step, in one process, alternating
(step_ab.run_ab), in the fewest device seconds: four settings of one engine.

    before       every projection through cuBLAS, the step's bookkeeping as tensor operations (the query packing,
                 Flash-Cache's plan and attention ranking), 64-row attention tiles: the ninth session's step
    bookkeeping  the same with the bookkeeping kernels
    auto         the engine's default now: the projection selectors free to pick split-K O/down and the fused
                 gate/up activation, the bookkeeping kernels
    auto-bm32    auto with 32-row attention tiles where the rule picks 64 (every batch-1 forward): fast-dllm's
                 32-row block fills a tile instead of half of one, and a flash-cache step has 4 tiles per head
                 instead of 2 (more programs, fewer key splits)

Before timing, layer 0's projections are checked against cuBLAS at 128 rows; after, the selectors' choices are
printed.    PYTHONPATH must hold benchmarks/ (source benchmarks/device_env.sh);
    step_kernels_ab.py [ROUNDS] [GEOMETRY] [CELLS]
"""
import os
import sys

import flash_dllm.engine.block_diffusion as block_diffusion
import flash_dllm.engine.packing as packing
from flash_dllm.kernels import _gate_up_select as gate_up
from flash_dllm.kernels import _split_k_select as split_k
from flash_dllm.kernels import flash_cache_plan, pack_queries, rank_attended
from skinny_gemm_ab import projections_agree
from step_ab import pick_cells, run_ab

_ITERATIONS = int(os.environ.get("ITERATIONS", "0"))
CELLS = [(method, batch, _ITERATIONS or iterations) for method, batch, iterations in
         [("flash-cache", 1, 300), ("flash-verify", 1, 300), ("fast-dllm", 1, 300)]]
_inits = {cls: cls.__init__ for cls in (pack_queries.PackQueries, flash_cache_plan.FlashCachePlanOp,
                                        rank_attended.RankAttended)}
_forcings = []


def setting(projections_cublas: bool, bookkeeping_kernels: bool, tile_rows: int):
    def apply(engine):
        while _forcings:
            _forcings.pop().__exit__(None, None, None)
        if projections_cublas:
            for family, choice in ((split_k.FAMILY, split_k.CUBLAS), (gate_up.FAMILY, gate_up.CUBLAS)):
                forcing = family.forced(choice)
                forcing.__enter__()
                _forcings.append(forcing)
        for cls, init in _inits.items():
            cls.__init__ = init if bookkeeping_kernels else (lambda self, _backend, init=init: init(self, "torch"))
        packing.ATTENTION_BLOCK_M = block_diffusion.ATTENTION_BLOCK_M = tile_rows
    return apply


if __name__ == "__main__":
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    geometry = sys.argv[2] if len(sys.argv) > 2 else "llada-8b"
    cells = pick_cells(CELLS, sys.argv[3] if len(sys.argv) > 3 else "all")
    run_ab(geometry, {"before": setting(True, False, 64), "bookkeeping": setting(True, True, 64),
                      "auto": setting(False, True, 64), "auto-bm32": setting(False, True, 32)},
           cells, rounds, header=projections_agree)
    for family in (split_k.FAMILY, gate_up.FAMILY):
        for (forcing, _, key), choice in family.choices.items():
            if forcing.choice is None:
                print("chosen", family.label, key[1:], choice, flush=True)
