"""The key splits' parts merged by the split kernel's last-arriving program (merge_in_split: one launch per layer)
against the separate combine kernel (two launches; the default), in the step, in one process, alternating (step_ab.run_ab).
    PYTHONPATH must hold benchmarks/;  attention_merge_ab.py [ROUNDS] [GEOMETRY]"""
import sys

from step_ab import run_ab


def setting(merge_in_split):
    def apply(engine):
        engine.ops.attention.triton.merge_in_split = merge_in_split
    return apply


if __name__ == "__main__":
    run_ab(sys.argv[2] if len(sys.argv) > 2 else "llada-8b",
           {"combine-kernel": setting(False), "merged-in-split": setting(True)},
           [("flash-cache", 1, 400), ("flash-verify", 1, 300), ("fast-dllm", 1, 400)],
           int(sys.argv[1]) if len(sys.argv) > 1 else 2)
