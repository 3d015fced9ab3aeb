"""The decode step with the attention mass computed elementwise (the default) or as a 16-row tensor-core dot
(MASS_BY_DOT, from mass-by-dot.patch, which must be applied), alternating in one process (benchmarks/step_ab.py;
this script was rewritten onto that helper after its run, which measured the same way). LLaDA-8B geometry.

    mass_ab.py ROUNDS [CELLS]     CELLS: comma-separated method:batch, or "all"  (PYTHONPATH holds benchmarks/)
"""
import sys

from flash_dllm.kernels import _scheduled_attention_launcher as launcher
from step_ab import pick_cells, run_ab

CELLS = [("flash-cache", 1, 300), ("flash-verify", 1, 300), ("flash-cache", 8, 80)]


def mass(by_dot: bool):
    def apply(engine):
        launcher.MASS_BY_DOT = by_dot  # read when the attention op makes a schedule (step_ab clears them)
    return apply


if __name__ == "__main__":
    assert hasattr(launcher, "MASS_BY_DOT"), "apply mass-by-dot.patch first: without it both settings are the same"
    run_ab("llada-8b", {"elementwise": mass(False), "by-dot": mass(True)},
           pick_cells(CELLS, sys.argv[2] if len(sys.argv) > 2 else "all"), int(sys.argv[1]) if len(sys.argv) > 1 else 2)
