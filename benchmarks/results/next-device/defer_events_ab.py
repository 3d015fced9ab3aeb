"""fast-dllm reads each step's record at once (its next layout follows the record): the record's events built
before the next launch (the old order: the GPU waits for them) against after it (DecodeSession.defer_events,
the default on CUDA), in the step, in one process, alternating (step_ab.run_ab).
    PYTHONPATH must hold benchmarks/;  defer_events_ab.py [ROUNDS] [GEOMETRY]"""
import sys

from flash_dllm.engine import decode_loop
from step_ab import run_ab

_init = decode_loop.DecodeSession.__init__


def setting(defer: bool):
    def apply(engine):
        def init(self, *args, **kwargs):
            _init(self, *args, **kwargs)
            self.defer_events = defer
        decode_loop.DecodeSession.__init__ = init
    return apply


if __name__ == "__main__":
    run_ab(sys.argv[2] if len(sys.argv) > 2 else "llada-8b", {"events-first": setting(False), "deferred": setting(True)},
           [("fast-dllm", 1, 300), ("fast-dllm", 8, 150)], int(sys.argv[1]) if len(sys.argv) > 1 else 2)
