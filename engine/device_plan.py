"""The decoding methods on the device: what each step recomputes and what it commits, as tensor operations.

Each method mirrors its host reference (engine/refresh.py for which positions a step recomputes,
engine/strategies.py for what it commits) decision for decision, so the two give the same tokens; here
everything is computed for all slots at once with shapes fixed by the method's budgets, nothing waits for
the host, and a step can be captured once and replayed as a CUDA graph.

Per step, in this order (engine/decode_loop.py owns the loop):
    plan(canvas) -> QueryPlan         reads the canvas and what the previous step left (commits, attention)
    forward, predictions at plan.cells
    note_attention(canvas, cache)     Flash-Cache only: rank decoded positions by this step's attention mass
    predict(logits, temperature, keys) the step's predictions at plan.cells (method-specific confidence)
    select(canvas, plan, preds)       [S, R] bool, which candidate cells to commit (threshold rules may swap
                                      in a fallback token where every chosen cell predicted [MASK])
    (the loop commits; a verifier, if any, drafts and verifies)
    end_step(canvas)                  advance per-sequence schedules after the step's commits
`full_next(canvas)` says which slots' next step recomputes every position; the host reads it to lay out
that step (only fast-dllm's depends on the data: a block ends when its last mask is committed).
"""
from __future__ import annotations

import dataclasses

import torch

from flash_dllm.engine.device_canvas import NOT_NEW, DeviceCanvas
from flash_dllm.engine.packing import QueryPlan
from flash_dllm.engine.sampling import Predictions, predict
from flash_dllm.kernels import flash_cache_plan
from flash_dllm.kernels.block_schedule import BlockCursors, BlockScheduleOp, BlockShape
from flash_dllm.kernels.flash_cache_plan import FlashCachePlanOp, PlanShape, first_cells  # noqa: F401 (re-export)
from flash_dllm.kernels.greedy_predict import GreedyPredict
from flash_dllm.kernels.rank_attended import RankAttended
from flash_dllm.kernels.threshold_select import ThresholdSelect, ensure_progress_reference

assert flash_cache_plan.NOT_NEW == NOT_NEW, "the plan kernel reads the canvas's newly_rank"


def ensure_progress(cells: torch.Tensor, preds: Predictions, chosen: torch.Tensor, mask_id: int) -> torch.Tensor:
    """strategies.ensure_progress on every row (kernels/threshold_select.py's ensure_progress_reference): where
    no chosen candidate predicted a real token, also choose the candidate with the most probable real token and
    swap that token (and its probability) into `preds`."""
    shape = cells.shape
    chosen, preds.tokens, preds.confidences = ensure_progress_reference(
        cells, chosen, preds.tokens.view(shape), preds.confidences.view(shape), preds.fallback_tokens.view(shape),
        preds.fallback_confidences.view(shape), mask_id)
    return chosen


def select_by_threshold(kernel: ThresholdSelect, canvas: DeviceCanvas, cells: torch.Tensor, preds: Predictions
                        ) -> torch.Tensor:
    """threshold_select then ensure_progress, in one kernel on a GPU (kernels/threshold_select.py): the
    chosen candidates; the swapped-in fallback tokens and probabilities are written into `preds`."""
    shape = cells.shape
    chosen, preds.tokens, preds.confidences = kernel(
        cells, preds.confidences.view(shape), preds.tokens.view(shape), preds.fallback_tokens.view(shape),
        preds.fallback_confidences.view(shape), canvas.threshold, mask_id=canvas.mask_id)
    return chosen


def top_k_select(cells: torch.Tensor, confidences: torch.Tensor, quota: torch.Tensor) -> torch.Tensor:
    """The quota[s] most confident candidates of each row (ties: the earlier one, as torch.topk on CUDA)."""
    valid = cells >= 0
    key = torch.where(valid, -confidences, float("inf"))
    order = torch.sort(key, dim=1, stable=True).indices
    positions = torch.arange(order.shape[1], device=order.device).expand_as(order)
    rank = torch.empty_like(order).scatter_(1, order, positions)
    return valid & (rank < quota[:, None])


class DeviceMethod:
    steady_rows: int = 0  # query rows per slot of a steady step
    readout: int = 0  # candidate cells per slot (R)
    forwards_per_step: int = 1
    tracks_attention: bool = False
    layout_follows_data: bool = False  # the host must read a step's record before laying out the next one
    step_limit: int | None = None  # a fixed-schedule method's number of steps per sequence
    native_confidence: bool = False  # rank on the softmax in the logits' dtype (LLaDA's generate.py)
    mask_id: int = -1

    greedy: GreedyPredict | None = None  # the greedy predictions' kernels (None: their tensor operations)
    threshold_kernel: ThresholdSelect = ThresholdSelect("torch")  # the threshold methods' select

    def use_kernels(self, backend: str) -> None:
        """Predict and select with the Triton kernels ("triton") or their references ("torch")."""
        if self.greedy is None or self.greedy.backend != backend:
            self.greedy, self.threshold_kernel = GreedyPredict(backend), ThresholdSelect(backend)

    def bind(self, canvas: DeviceCanvas, official_end: bool) -> None:
        """Write the call's end rule and step limit into the canvas (constant for a session's every call)."""
        canvas.official_end.fill_(official_end)
        if self.step_limit is not None:
            canvas.max_steps.fill_(self.step_limit)
        self.mask_id = canvas.mask_id

    def predict(self, logits: torch.Tensor, temperature: torch.Tensor | None, keys: torch.Tensor | None,
                cells: torch.Tensor | None = None) -> Predictions:
        """Predictions from the logits at the step's candidate rows (cells: those candidates, flattened)."""
        return predict(logits, temperature, keys, mask_id=self.mask_id, native_confidence=self.native_confidence,
                       greedy=self.greedy)

    def reset(self, canvas: DeviceCanvas) -> None:
        """Forget the previous call's per-sequence state (after canvas.load)."""

    def reset_slot(self, canvas: DeviceCanvas, slot: int) -> None:
        """Forget one slot's state (after canvas.load_slot)."""

    def full_next(self, canvas: DeviceCanvas) -> torch.Tensor:
        return torch.zeros_like(canvas.active)

    def note_attention(self, canvas: DeviceCanvas, cache) -> None:
        """cache: the step's KVCache (its `scores`, attention mass per pool row, and `row_base`)."""

    def end_step(self, canvas: DeviceCanvas) -> None:
        pass


class FlashCache(DeviceMethod):
    """Sliding masked window + look-ahead masks + tracked decoded tokens (engine/refresh.py:FlashCachePolicy).
    Its plan is one op (kernels/flash_cache_plan.py: one kernel launch on a GPU)."""

    tracks_attention = True

    def __init__(self, canvas: DeviceCanvas, window: int, lookahead: int, track: int, shift: bool):
        self.window, self.lookahead, self.track, self.shift = window, lookahead, track, shift
        L = canvas.slot_len
        self.steady_rows = L if track < 0 else min(L, window * (2 if shift else 1) + lookahead + track)
        self.readout = window
        self.attended = torch.full((canvas.n_slots, max(min(track, L), 1)), -1, dtype=torch.int64,
                                   device=canvas.tokens.device)
        self.shape = PlanShape(window=window, lookahead=lookahead, track=track, shift=shift, slot_len=L)
        self.plan_op, self.rank_op = FlashCachePlanOp("torch"), RankAttended("torch")
        self.tracks_attention = track > 0

    def use_kernels(self, backend: str) -> None:
        super().use_kernels(backend)
        if self.plan_op.backend != backend:
            self.plan_op, self.rank_op = FlashCachePlanOp(backend), RankAttended(backend)

    def reset(self, canvas: DeviceCanvas) -> None:
        self.attended.fill_(-1)

    def reset_slot(self, canvas: DeviceCanvas, slot: int) -> None:
        self.attended[slot] = -1

    def plan(self, canvas: DeviceCanvas) -> QueryPlan:
        plan = self.plan_op(canvas.answer, canvas.newly_rank, self.attended, canvas.prompt_len, canvas.gen_len,
                            canvas.end, canvas.official_end, canvas.steps, canvas.max_steps, canvas.active,
                            self.shape)
        return QueryPlan(in_query=plan.in_query, cells=plan.cells, scored=plan.scored)

    def note_attention(self, canvas: DeviceCanvas, cache) -> None:
        """Rank the decoded positions (prompt, committed cells) by the attention mass the window gave them
        (kernels/rank_attended.py: one kernel launch on a GPU)."""
        if self.track > 0:
            self.rank_op(cache.scores, cache.row_base, canvas.prompt_len, canvas.gen_len, canvas.answer,
                         canvas.active, self.attended, canvas.slot_len)

    def select(self, canvas: DeviceCanvas, plan: QueryPlan, preds: Predictions) -> torch.Tensor:
        return select_by_threshold(self.threshold_kernel, canvas, plan.cells, preds)


class BlockSchedule(DeviceMethod):
    """Semi-autoregressive blocks (engine/strategies.py:BlockStrategy): the current block is the first one
    that still has a masked cell; `cursors.step_in_block` counts the steps taken in it. Advancing is one op
    (kernels/block_schedule.py: one kernel launch on a GPU)."""

    def __init__(self, canvas: DeviceCanvas, block_length: int, shift: bool):
        self.block_length, self.shift = block_length, shift
        self.readout = block_length
        self.shape = BlockShape(block_length=block_length, slot_len=canvas.slot_len, shift=shift)
        self.cursors = BlockCursors.zeros(canvas.n_slots, canvas.tokens.device)
        self.schedule_op = BlockScheduleOp("torch")
        self.reset(canvas)

    def use_kernels(self, backend: str) -> None:
        super().use_kernels(backend)
        if self.schedule_op.backend != backend:
            self.schedule_op = BlockScheduleOp(backend)

    def reset(self, canvas: DeviceCanvas) -> None:
        self._advance(canvas, restart=torch.ones_like(canvas.active))

    def reset_slot(self, canvas: DeviceCanvas, slot: int) -> None:
        restart = torch.zeros_like(canvas.active)
        restart[slot] = True
        self._advance(canvas, restart=restart)

    def _advance(self, canvas: DeviceCanvas, restart: torch.Tensor | None = None) -> None:
        """Without `restart`: count the step, then move each slot to its first block with a masked cell; a slot
        that moves (or restarts, from block 0) begins it."""
        self.schedule_op.advance(canvas.answer, canvas.gen_len, canvas.end, canvas.official_end, canvas.steps,
                                 canvas.max_steps, canvas.active, self.cursors, self.shape, restart)

    def end_step(self, canvas: DeviceCanvas) -> None:
        self._advance(canvas)

    def full_next(self, canvas: DeviceCanvas) -> torch.Tensor:
        return canvas.active & (self.cursors.step_in_block == 0)


class FastDllm(BlockSchedule):
    """Fast-dLLM (engine/refresh.py:FastDllmPolicy): everything at a block's first step, then the block only
    (dual cache) or the block and everything after it (prefix cache); commit by threshold. Its plan is one op
    (kernels/block_schedule.py: one kernel launch on a GPU)."""

    layout_follows_data = True  # a block's first step recomputes everything; when it comes depends on commits

    def __init__(self, canvas: DeviceCanvas, block_length: int, mode: str, shift: bool):
        super().__init__(canvas, block_length, shift)
        self.shape = dataclasses.replace(self.shape, mode=mode)
        extra = 1 if shift else 0
        self.steady_rows = min(canvas.slot_len, (block_length if mode == "dual" else canvas.width) + extra)

    def plan(self, canvas: DeviceCanvas) -> QueryPlan:
        plan = self.schedule_op.plan(canvas.answer, canvas.prompt_len, canvas.gen_len, canvas.end,
                                     canvas.official_end, canvas.steps, canvas.max_steps, canvas.active,
                                     self.cursors, self.shape)
        return QueryPlan(in_query=plan.in_query, cells=plan.cells)

    def select(self, canvas: DeviceCanvas, plan: QueryPlan, preds: Predictions) -> torch.Tensor:
        return select_by_threshold(self.threshold_kernel, canvas, plan.cells, preds)


class LladaTopK(DeviceMethod):
    """LLaDA's published sampler (engine/strategies.py:LowConfidenceTopK): every position recomputed each
    step; block b gets steps b * spb ... (b + 1) * spb - 1, each committing the k most confident candidates
    (the block's masks, after up to block_length masks left before it), k from the even split of the block's
    masks at its first step. Confidences in the logits' dtype, ties to the earlier cell (torch.topk on CUDA)."""

    native_confidence = True

    def __init__(self, canvas: DeviceCanvas, block_length: int, steps_per_block: int, cfg_scale: float, shift: bool,
                 gen_length: int | None = None):
        self.block_length, self.shift = block_length, shift
        self.steps_per_block = steps_per_block
        self.cfg_scale = cfg_scale
        self.forwards_per_step = 2 if cfg_scale > 0 else 1
        self.steady_rows = canvas.slot_len
        self.readout = min(2 * block_length, canvas.width)
        # the schedule's steps: the answer's blocks (a scheduler's canvas is wider than the answer) times spb
        self.step_limit = (gen_length or canvas.width) // block_length * steps_per_block
        self.block_masks = torch.zeros(canvas.n_slots, dtype=torch.int64, device=canvas.tokens.device)

    def plan(self, canvas: DeviceCanvas) -> QueryPlan:
        position = canvas.positions
        in_query = (position < canvas.total_len()[:, None]) & canvas.active[:, None]
        block, step = canvas.steps // self.steps_per_block, canvas.steps % self.steps_per_block
        start = (block * self.block_length)[:, None]
        cell, masked = canvas.cells(), canvas.masked()
        own = masked & (cell >= start) & (cell < start + self.block_length)
        # the block's quotas are fixed by its masks at its first step (plan runs once per step, before commits)
        self.block_masks.copy_(torch.where(step == 0, own.sum(1), self.block_masks))
        earlier = first_cells(masked & (cell < start), self.readout - self.block_length)
        cells = torch.cat([earlier, first_cells(own, self.block_length)], dim=1)
        return QueryPlan(in_query=in_query, cells=cells)

    def select(self, canvas: DeviceCanvas, plan: QueryPlan, preds: Predictions) -> torch.Tensor:
        step = canvas.steps % self.steps_per_block
        base, extra = self.block_masks // self.steps_per_block, self.block_masks % self.steps_per_block
        quota = base + (step < extra).long()
        n_cells = (plan.cells >= 0).sum(1)
        quota = torch.maximum(quota, (n_cells > 0).long())
        return top_k_select(plan.cells, preds.confidences.view(plan.cells.shape), quota)
