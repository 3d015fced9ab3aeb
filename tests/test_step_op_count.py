"""How many device operations a steady decode step launches besides the model's forward.

At batch 1 on a GPU each small kernel costs a few microseconds of launch and tail even inside a CUDA graph, and
a step is a few milliseconds: the bookkeeping around the forward (plan, predictions, commit, record) was about
280 kernels for flash-cache and 450 for flash-verify before the commit became one kernel. This counts the
operations that reach the dispatcher (views excluded) during one steady step on the CPU, each of the step's
Triton kernels as its launches (commit, threshold select, greedy predictions, query packing, Flash-Cache's
plan and attention ranking, the block schedule's advance and Fast-dLLM's plan, Flash-Verify's pick, pack and
accept), and holds each method under its
budget so that the count only goes down. `-s` prints the counts. It also holds a steady step free of tensors made
from Python lists (host-to-device copies a CUDA graph cannot capture).
"""
from __future__ import annotations

import collections

import pytest
from torch.utils._python_dispatch import TorchDispatchMode

from flash_dllm.engine import decode_loop
from flash_dllm.engine.engine import Engine
from flash_dllm.engine.settings import GenerationSettings
from flash_dllm.engine.tiny import TinySpec, write_tiny_model
from flash_dllm.kernels import (block_schedule, canvas_commit, flash_cache_plan, greedy_predict, pack_queries,
                                rank_attended, threshold_select, verify_batch)

# what views cost: no kernel
VIEWS = {"view", "unsqueeze", "slice", "select", "expand", "t", "_unsafe_view", "transpose", "split",
         "split_with_sizes", "alias", "as_strided", "squeeze", "permute", "unbind", "lift_fresh",
         "_local_scalar_dense", "detach"}
# The budgets: the counts at the time of writing (torch 2.13, CPU), per method. Lower them when they fall.
BUDGETS = {"flash-cache": 33, "flash-verify": 42, "fast-dllm": 33, "llada": 104}
METHODS = {"flash-cache": {}, "flash-verify": dict(gamma=0.5), "fast-dllm": dict(cache_mode="dual"), "llada": {}}


class _Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: collections.Counter = collections.Counter()
        self.paused = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if not self.paused and name not in VIEWS:
            self.ops[name] += 1
        return func(*args, **(kwargs or {}))


def count_step_ops(engine: Engine, settings: GenerationSettings, step: int) -> collections.Counter:
    """Operations of decode step `step` (0 = the first) outside the model's forward and head; each of the
    step's own kernels counts its launches (commit, threshold select, packing, plans, ranking, the block
    schedule's advance and Flash-Verify's pick, pack and accept one, greedy predictions two)."""
    counts: list[_Count] = []
    forward, head, step_fn = decode_loop.forward_cached, decode_loop.lm_logits, decode_loop.DecodeSession.step
    commit_call, select_call = canvas_commit.CanvasCommit.__call__, threshold_select.ThresholdSelect.__call__
    predict_call = greedy_predict.GreedyPredict.__call__
    pack_call = pack_queries.PackQueries.__call__
    plan_call = flash_cache_plan.FlashCachePlanOp.__call__
    rank_call = rank_attended.RankAttended.__call__
    advance_call, block_plan_call = block_schedule.BlockScheduleOp.advance, block_schedule.BlockScheduleOp.plan
    verify_op = verify_batch.VerifyOp
    pick_call, verify_pack_call, accept_call = verify_op.pick, verify_op.pack, verify_op.accept

    def counted_step(self, layouts):
        with _Count() as mode:
            counts.append(mode)
            step_fn(self, layouts)

    def paused(fn, name=None, launches=1):
        def run(*args, **kwargs):
            mode = counts[-1] if counts else None
            if mode is not None:
                if name:
                    mode.ops[name] += launches
                mode.paused += 1
            try:
                return fn(*args, **kwargs)
            finally:
                if mode is not None:
                    mode.paused -= 1
        return run

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(decode_loop.DecodeSession, "step", counted_step)
        patch.setattr(decode_loop, "forward_cached", paused(forward))
        patch.setattr(decode_loop, "lm_logits", paused(head))
        patch.setattr(canvas_commit.CanvasCommit, "__call__", paused(commit_call, "canvas_commit"))
        patch.setattr(threshold_select.ThresholdSelect, "__call__", paused(select_call, "threshold_select"))
        patch.setattr(greedy_predict.GreedyPredict, "__call__", paused(predict_call, "greedy_predict", launches=2))
        patch.setattr(pack_queries.PackQueries, "__call__", paused(pack_call, "pack_queries"))
        patch.setattr(flash_cache_plan.FlashCachePlanOp, "__call__", paused(plan_call, "flash_cache_plan"))
        patch.setattr(rank_attended.RankAttended, "__call__", paused(rank_call, "rank_attended"))
        patch.setattr(block_schedule.BlockScheduleOp, "advance", paused(advance_call, "block_advance"))
        patch.setattr(block_schedule.BlockScheduleOp, "plan", paused(block_plan_call, "fast_dllm_plan"))
        patch.setattr(verify_op, "pick", paused(pick_call, "verify_pick"))
        patch.setattr(verify_op, "pack", paused(verify_pack_call, "verify_pack"))
        patch.setattr(verify_op, "accept", paused(accept_call, "verify_accept"))
        engine.generate(["What is 7 + 5?"], settings)
    assert len(counts) > step, f"only {len(counts)} steps"
    return counts[step].ops


@pytest.fixture(scope="module")
def engine(tmp_path_factory) -> Engine:
    return Engine.load(str(write_tiny_model(tmp_path_factory.mktemp("llada"), TinySpec())), device="cpu")


@pytest.mark.parametrize("method", sorted(BUDGETS))
def test_steady_step_bookkeeping_stays_within_budget(engine, method):
    settings = GenerationSettings(method=method, gen_length=32, block_length=16, threshold=1.0, steps=32,
                                  **METHODS[method])
    ops = count_step_ops(engine, settings, step=4)
    total = sum(ops.values())
    print(f"{method}: {total} operations besides the forward; most: {ops.most_common(8)}")
    assert ops["canvas_commit"] == (2 if method == "flash-verify" else 1)
    assert total <= BUDGETS[method], f"{method}: {total} > {BUDGETS[method]} ({ops.most_common(12)})"


def test_the_counter_sees_operations(engine):
    """A counter that saw nothing would pass every budget."""
    ops = count_step_ops(engine, GenerationSettings(method="flash-cache", gen_length=32, threshold=1.0), step=3)
    assert ops["copy_"] >= 1 and ops["canvas_commit"] == 1 and ops["rank_attended"] == 1 and sum(ops.values()) > 20
    assert not any(name in ops for name in ("mm", "addmm", "bmm", "linear"))  # the forward is not counted


class _HostData(TorchDispatchMode):
    """Records tensors made from Python lists (torch.tensor(...) reaches the dispatcher as lift_fresh): on a GPU
    each is a host-to-device copy, which a CUDA graph cannot capture. Python numbers (0-dim) are kernel arguments."""

    def __init__(self):
        super().__init__()
        self.seen: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__.startswith("lift_fresh") and args and args[0].dim() > 0:
            self.seen.append(tuple(args[0].shape))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("method", sorted(BUDGETS))
def test_a_steady_step_makes_no_tensor_from_host_data(engine, method):
    """The steps of a call whose layouts are already built (a chat's next turn: the step a CUDA graph replays),
    forward included, with the kernels' torch references: what `--kernels torch` captures on a GPU."""
    settings = GenerationSettings(method=method, gen_length=32, block_length=16, threshold=1.0, steps=32,
                                  **METHODS[method])
    engine.generate(["What is 7 + 5?"], settings)  # builds the session's layouts
    step_fn, seen = decode_loop.DecodeSession.step, []

    def watched_step(self, layouts):
        with _HostData() as mode:
            step_fn(self, layouts)
        seen.extend(mode.seen)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(decode_loop.DecodeSession, "step", watched_step)
        engine.generate(["What is 7 + 5?"], settings)
    assert not seen, f"{method}: {len(seen)} tensors made from host data in its steps ({seen[:3]})"
