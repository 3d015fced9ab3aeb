"""The step's bookkeeping kernels (query packing, Flash-Cache's plan and attention ranking) against the tensor
operations they replace (their references, still on the GPU and inside the CUDA graph), in one process, alternating (step_ab.run_ab).
The ops are rebuilt with each decode session, so the setting patches which backend they bind to.

    PYTHONPATH must hold benchmarks/ (source benchmarks/device_env.sh);  bookkeeping_ab.py [ROUNDS] [GEOMETRY] [CELLS]
"""
import os
import sys

from flash_dllm.kernels import flash_cache_plan, pack_queries, rank_attended
from step_ab import pick_cells, run_ab

_ITERATIONS = int(os.environ.get("ITERATIONS", "0"))
CELLS = [(method, batch, _ITERATIONS or iterations) for method, batch, iterations in
         [("flash-cache", 1, 300), ("flash-verify", 1, 300), ("flash-cache", 8, 80)]]
_inits = {cls: cls.__init__ for cls in (pack_queries.PackQueries, flash_cache_plan.FlashCachePlanOp,
                                     rank_attended.RankAttended)}


def setting(backend):
    def apply(engine):
        for cls, init in _inits.items():
            cls.__init__ = (lambda self, _backend, init=init: init(self, backend)) if backend else init
    return apply


if __name__ == "__main__":
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    geometry = sys.argv[2] if len(sys.argv) > 2 else "llada-8b"
    cells = pick_cells(CELLS, sys.argv[3] if len(sys.argv) > 3 else "all")
    run_ab(geometry, {"tensor-ops": setting("torch"), "kernels": setting(None)}, cells, rounds)
