"""Flash-Verify's verify-pass bookkeeping: the kernels (kernels/verify_batch.py) against their tensor-operation
references, in the step, in one process, alternating (step_ab.run_ab).
    PYTHONPATH must hold benchmarks/;  verify_batch_ab.py [ROUNDS] [GEOMETRY]"""
import sys

from flash_dllm.kernels import verify_batch
from step_ab import run_ab

_init = verify_batch.VerifyOp.__init__


def setting(backend):
    def apply(engine):
        verify_batch.VerifyOp.__init__ = (
            (lambda self, _backend, *a, **k: _init(self, backend, *a, **k)) if backend else _init)
    return apply


if __name__ == "__main__":
    run_ab(sys.argv[2] if len(sys.argv) > 2 else "llada-8b", {"tensor-ops": setting("torch"), "kernels": setting(None)},
           [("flash-verify", 1, 300)], int(sys.argv[1]) if len(sys.argv) > 1 else 2)
