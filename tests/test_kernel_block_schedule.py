"""The block schedule's kernels (kernels/block_schedule.py: advance, Fast-dLLM's plan) against their
tensor-operation references, bit for bit.

Random canvases: blocks fully decoded, partly masked or fully masked (whole answers decoded included), the end
token mid-answer under both end rules, answers shorter than the canvas, sequences out of steps or inactive,
cursors on any block at any step (a block's first step included); both cache modes, with and without Dream's
shift, odd block lengths, canvases and slots longer than a chunk, blocks longer than a chunk. Then whole
schedules: commits step after step, both paths advancing and planning side by side. Runs through the CPU
interpreter (TRITON_INTERPRET=1) or compiled on a CUDA machine.
"""
from kernel_testing import DEVICE, needs_triton  # noqa: F401  (sets TRITON_INTERPRET first)

import dataclasses  # noqa: E402
import itertools  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from flash_dllm.kernels.block_schedule import (BlockCursors, BlockScheduleOp, BlockShape,  # noqa: E402
                                               block_advance_reference, fast_dllm_plan_reference)

pytestmark = needs_triton

UNLIMITED = 1 << 40


@dataclasses.dataclass
class Canvas:
    """What the schedule reads of a DeviceCanvas."""

    answer: torch.Tensor
    prompt_len: torch.Tensor
    gen_len: torch.Tensor
    end: torch.Tensor
    official_end: torch.Tensor
    steps: torch.Tensor
    max_steps: torch.Tensor
    active: torch.Tensor

    def for_advance(self):
        return (self.answer, self.gen_len, self.end, self.official_end, self.steps, self.max_steps, self.active)

    def for_plan(self):
        return (self.answer, self.prompt_len, self.gen_len, self.end, self.official_end, self.steps,
                self.max_steps, self.active)


def random_canvas(S, B, n_blocks, L, seed) -> tuple[Canvas, BlockCursors]:
    gen = torch.Generator().manual_seed(seed)
    G = B * n_blocks
    prompt_len = torch.randint(0, L - G + 1, (S,), generator=gen)
    gen_len = torch.where(torch.rand(S, generator=gen) < 0.5, G, torch.randint(G // 2, G + 1, (S,), generator=gen))
    # per block: decoded, a few masks, half masked or all masked; some answers decoded throughout
    density = torch.tensor([0.0, 0.05, 0.5, 1.0])[torch.randint(0, 4, (S, n_blocks), generator=gen)]
    density[torch.rand(S, generator=gen) < 0.2] = 0.0
    masked = torch.rand(S, n_blocks, B, generator=gen) < density[:, :, None]
    tokens = torch.randint(0, 100, (S, G), generator=gen)
    answer = torch.where(masked.reshape(S, G), -1, tokens)
    end = torch.where(torch.rand(S, generator=gen) < 0.5, torch.randint(0, G, (S,), generator=gen), gen_len)
    official_end = torch.rand(S, generator=gen) < 0.5
    steps = torch.randint(0, 6, (S,), generator=gen)
    max_steps = torch.where(torch.rand(S, generator=gen) < 0.2, steps, torch.full((S,), UNLIMITED))
    active = torch.rand(S, generator=gen) < 0.8
    cursors = BlockCursors(
        block=torch.randint(0, n_blocks, (S,), generator=gen),
        step_in_block=torch.where(torch.rand(S, generator=gen) < 0.4, 0, torch.randint(1, 5, (S,), generator=gen)),
        block_masks=torch.randint(0, B + 1, (S,), generator=gen))
    canvas = Canvas(*(t.to(DEVICE) for t in (answer, prompt_len, gen_len, end, official_end, steps, max_steps,
                                              active)))
    return canvas, BlockCursors(*(t.to(DEVICE) for t in dataclasses.astuple(cursors)))


def copied(cursors: BlockCursors) -> BlockCursors:
    return BlockCursors(*(t.clone() for t in dataclasses.astuple(cursors)))


def same(got: BlockCursors, expected: BlockCursors) -> bool:
    return all(torch.equal(a, b) for a, b in zip(dataclasses.astuple(got), dataclasses.astuple(expected)))


def check_advance(canvas: Canvas, cursors: BlockCursors, shape: BlockShape, restart=None) -> BlockCursors:
    expected, got = copied(cursors), copied(cursors)
    block_advance_reference(*canvas.for_advance(), expected, shape, restart)
    BlockScheduleOp("triton").advance(*canvas.for_advance(), got, shape, restart)
    assert same(got, expected), (cursors, got, expected)
    return expected


def check_plan(canvas: Canvas, cursors: BlockCursors, shape: BlockShape):
    expected = fast_dllm_plan_reference(*canvas.for_plan(), cursors, shape)
    got = BlockScheduleOp("triton").plan(*canvas.for_plan(), copied(cursors), shape)
    assert torch.equal(got.cells, expected.cells), (got.cells, expected.cells)
    assert torch.equal(got.in_query, expected.in_query), (got.in_query ^ expected.in_query).nonzero()[:8]
    return expected


@pytest.mark.parametrize("B,n_blocks", [(1, 9), (3, 7), (8, 4), (13, 5), (32, 3)])
def test_advance_matches_the_reference(B, n_blocks):
    shape = BlockShape(block_length=B, slot_len=B * n_blocks + 20)
    moved = 0
    for seed in range(4):
        canvas, cursors = random_canvas(S=7, B=B, n_blocks=n_blocks, L=shape.slot_len, seed=seed * 31 + B)
        moved += int((check_advance(canvas, cursors, shape).block != cursors.block).sum())
    assert 0 < moved < 28  # some slots move on, some stay


@pytest.mark.parametrize("B,n_blocks", [(3, 7), (16, 4)])
def test_restart_matches_the_reference(B, n_blocks):
    shape = BlockShape(block_length=B, slot_len=B * n_blocks + 9)
    for seed in range(3):
        canvas, cursors = random_canvas(S=6, B=B, n_blocks=n_blocks, L=shape.slot_len, seed=seed * 17 + B)
        check_advance(canvas, cursors, shape, restart=torch.ones_like(canvas.active))  # a new call
        one = torch.zeros_like(canvas.active)
        one[seed % 6] = True  # a slot admitted while the others decode on
        check_advance(canvas, cursors, shape, restart=one)
        check_advance(canvas, cursors, shape, restart=torch.rand(6, device=DEVICE) < 0.5)


@pytest.mark.parametrize("shift,mode,B", list(itertools.product([False, True], ["dual", "prefix"], [1, 5, 16])))
def test_plan_matches_the_reference(shift, mode, B):
    n_blocks = 6
    shape = BlockShape(block_length=B, slot_len=B * n_blocks + 11, shift=shift, mode=mode)
    cells = rows = 0
    for seed in range(4):
        canvas, cursors = random_canvas(S=7, B=B, n_blocks=n_blocks, L=shape.slot_len, seed=seed * 13 + B)
        check_plan(canvas, cursors, shape)  # any block, any step
        plan = check_plan(canvas, check_advance(canvas, cursors, shape), shape)  # the blocks a step moves to
        cells, rows = cells + int((plan.cells >= 0).sum()), rows + int(plan.in_query.sum())
    assert cells > 0 and rows > 0


def test_a_sequence_at_position_zero_with_shift():
    """A block starting at position 0 has no position before it: the plan starts at 0."""
    shape = BlockShape(block_length=4, slot_len=16, shift=True, mode="dual")
    canvas, cursors = random_canvas(S=3, B=4, n_blocks=4, L=16, seed=2)
    canvas.prompt_len.zero_()
    cursors.block.zero_()
    cursors.step_in_block.fill_(2)
    canvas.active.fill_(True)
    plan = check_plan(canvas, cursors, shape)
    assert plan.in_query[:, :4].all() and not plan.in_query[:, 4:].any()


@pytest.mark.parametrize("shift,mode", [(False, "dual"), (True, "prefix")])
def test_long_canvases_cross_chunks(shift, mode):
    """Canvases and slots longer than a chunk (512), and blocks longer than one."""
    for B, n_blocks, L in ((40, 30, 1700), (520, 2, 1300)):
        shape = BlockShape(block_length=B, slot_len=L, shift=shift, mode=mode)
        for seed in range(2):
            canvas, cursors = random_canvas(S=3, B=B, n_blocks=n_blocks, L=L, seed=seed + B)
            check_advance(canvas, cursors, shape)
            check_advance(canvas, cursors, shape, restart=torch.ones_like(canvas.active))
            check_plan(canvas, cursors, shape)


@pytest.mark.parametrize("B,n_blocks", [(4, 5), (7, 3)])
def test_whole_schedules_agree_step_by_step(B, n_blocks):
    """Both paths advance their own cursors through a call: a restart, then steps that each commit some masked
    cells of the current block (sometimes the end token, ending the answer), plan and advance."""
    gen = torch.Generator().manual_seed(B)
    shape = BlockShape(block_length=B, slot_len=B * n_blocks + 6, shift=True, mode="dual")
    canvas, cursors = random_canvas(S=5, B=B, n_blocks=n_blocks, L=shape.slot_len, seed=B)
    canvas.answer[:, : 2 * B] = -1
    canvas.max_steps.fill_(UNLIMITED)
    canvas.steps.zero_()
    reference, kernel = copied(cursors), copied(cursors)
    restart = torch.ones_like(canvas.active)
    block_advance_reference(*canvas.for_advance(), reference, shape, restart)
    BlockScheduleOp("triton").advance(*canvas.for_advance(), kernel, shape, restart)
    for step in range(3 * n_blocks):
        assert same(kernel, reference), step
        plan = check_plan(canvas, reference, shape)
        commit = (plan.cells >= 0) & (torch.rand(plan.cells.shape, generator=gen).to(DEVICE) < 0.4)
        for s, j in commit.nonzero().tolist():
            canvas.answer[s, plan.cells[s, j]] = 2 if torch.rand(1, generator=gen) < 0.05 else 50
        is_end = (canvas.answer == 2).long().argmax(1)
        canvas.end.copy_(torch.where((canvas.answer == 2).any(1), is_end, canvas.gen_len))
        block_advance_reference(*canvas.for_advance(), reference, shape)
        BlockScheduleOp("triton").advance(*canvas.for_advance(), kernel, shape)
        canvas.steps += canvas.active.long()
    assert same(kernel, reference)
