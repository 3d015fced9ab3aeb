"""The key splits' partial outputs stored in the inputs' dtype (bf16: the default) against fp32 (the old
workspace), and with the smaller partials, 6 key splits instead of the automatic count (4 at LLaDA-8B's batch
1 on 132 SMs), in the step, in one process, alternating (step_ab.run_ab).
    PYTHONPATH must hold benchmarks/;  attention_partials_ab.py [ROUNDS] [GEOMETRY] [SETTING,SETTING,...]"""
import sys

from step_ab import run_ab


def setting(fp32_partials, splits=None):
    def apply(engine):
        engine.ops.attention.triton.fp32_partials = fp32_partials
        engine.ops.attention.triton.forced_splits = splits
    return apply


if __name__ == "__main__":
    settings = {"fp32": setting(True), "input-dtype": setting(False), "input-dtype-6-splits": setting(False, 6)}
    if len(sys.argv) > 3:
        settings = {name: settings[name] for name in sys.argv[3].split(",")}
    run_ab(sys.argv[2] if len(sys.argv) > 2 else "llada-8b", settings,
           [("flash-cache", 1, 400), ("flash-verify", 1, 300)], int(sys.argv[1]) if len(sys.argv) > 1 else 2)
