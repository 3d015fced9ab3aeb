"""Flash-Verify's bookkeeping kernels (kernels/verify_batch.py: pick, pack, accept) against their tensor-operation
references, bit for bit.

Random canvases and windows: cells still to decode, already decoded, past the end or out of steps; inactive
sequences; [MASK] drafts; confidences drawn from a few values (ties, -0.0 against +0.0) or special ones (inf, NaN);
no candidates, fewer or more than the cap; the draft commit's cells absent, few, or more than the window, on
answers longer than a chunk. The pack on those batches and on hand-made ones (the host reference's, drafts
padded with [MASK]), with and without Dream's shift (neighbouring candidates in either order, a candidate at
position 0); the accept under both rules, with gamma on the exact running product and one ulp either side.
Window and cap as the engine uses them (16 and 8) and odd ones. Runs through the CPU interpreter
(TRITON_INTERPRET=1) or compiled on a CUDA machine.
"""
from kernel_testing import DEVICE, needs_triton  # noqa: F401  (sets TRITON_INTERPRET first)

import dataclasses  # noqa: E402
import itertools  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from flash_dllm.engine.verify import chain_visibility  # noqa: E402
from flash_dllm.kernels.verify_batch import (NOT_NEW, VerifyBatch, VerifyCounters, VerifyOp,  # noqa: E402
                                             VerifyShape, verify_accept_reference, verify_pack_reference,
                                             verify_pick_reference)

pytestmark = needs_triton

MASK_ID, TRASH_ROW = 99, 3
SIZES = [(16, 8), (5, 3), (4, 4), (7, 9)]  # window, cap (a cap above the window keeps the window's width)


@dataclasses.dataclass
class Canvas:
    """What the verify ops read of a DeviceCanvas and its cache."""

    answer: torch.Tensor
    newly_rank: torch.Tensor
    prompt_len: torch.Tensor
    gen_len: torch.Tensor
    end: torch.Tensor
    official_end: torch.Tensor
    steps: torch.Tensor
    max_steps: torch.Tensor
    active: torch.Tensor
    tokens: torch.Tensor  # [S, L + 1]
    row_base: torch.Tensor

    def for_pick(self):
        return (self.answer, self.newly_rank, self.gen_len, self.end, self.official_end, self.steps, self.max_steps,
                self.active)


def random_canvas(S, G, L, seed, new_count=None) -> Canvas:
    gen = torch.Generator().manual_seed(seed)
    prompt_len = torch.randint(0, L - G + 1, (S,), generator=gen)
    prompt_len[0] = 0 if L > G else prompt_len[0]  # a candidate at position 0 (no position before it)
    gen_len = torch.where(torch.rand(S, generator=gen) < 0.5, G, torch.randint(G // 2, G + 1, (S,), generator=gen))
    answer = torch.where(torch.rand(S, G, generator=gen) < 0.6, -1, torch.randint(0, 100, (S, G), generator=gen))
    newly_rank = torch.full((S, G), NOT_NEW, dtype=torch.int64)
    for s in range(S):  # the draft commit's cells: none, a few, or more than a window
        n = int(torch.randint(0, 3 * 16, (1,), generator=gen)) if new_count is None else new_count
        cells = torch.randperm(G, generator=gen)[: min(n, G)]
        newly_rank[s, cells] = torch.randperm(len(cells), generator=gen)
    end = torch.where(torch.rand(S, generator=gen) < 0.5, torch.randint(0, G, (S,), generator=gen), gen_len)
    official_end = torch.rand(S, generator=gen) < 0.5
    steps = torch.randint(0, 6, (S,), generator=gen)
    max_steps = torch.where(torch.rand(S, generator=gen) < 0.15, steps, torch.full((S,), 1 << 40))
    active = torch.rand(S, generator=gen) < 0.8
    tokens = torch.randint(0, 100, (S, L + 1), generator=gen)
    row_base = TRASH_ROW + 1 + torch.arange(S) * L
    return Canvas(*(t.to(DEVICE) for t in (answer, newly_rank, prompt_len, gen_len, end, official_end, steps,
                                           max_steps, active, tokens, row_base)))


def random_window(canvas: Canvas, W, seed, confidence_values=None):
    """Window cells (from a narrow range, so neighbours are common; -1 holes), drafts ([MASK] among them) and
    confidences (from `confidence_values` when given: ties)."""
    gen = torch.Generator().manual_seed(seed)
    S, G = canvas.answer.shape
    span = min(G, W + 4)
    cells = torch.stack([torch.randperm(span, generator=gen)[:W] + int(torch.randint(0, G - span + 1, (1,),
                                                                                     generator=gen))
                         for _ in range(S)])
    cells = torch.where(torch.rand(S, W, generator=gen) < 0.15, -1, cells)
    tokens = torch.where(torch.rand(S, W, generator=gen) < 0.15, MASK_ID, torch.randint(0, 100, (S, W), generator=gen))
    if confidence_values is None:
        confidences = torch.rand(S, W, generator=gen, dtype=torch.float64)
    else:
        values = torch.tensor(confidence_values, dtype=torch.float64)
        confidences = values[torch.randint(0, len(values), (S, W), generator=gen)]
    return cells.to(DEVICE), tokens.to(DEVICE), confidences.to(DEVICE)


def shape_for(cap, shift, L) -> VerifyShape:
    return VerifyShape(cap=cap, shift=shift, mask_id=MASK_ID, trash_row=TRASH_ROW, slot_len=L)


def same_batch(got: VerifyBatch, expected: VerifyBatch) -> bool:
    return all(torch.equal(a, b) for a, b in zip(dataclasses.astuple(got), dataclasses.astuple(expected)))


def check_pick(canvas: Canvas, window, shape: VerifyShape) -> VerifyBatch:
    expected = verify_pick_reference(*canvas.for_pick(), *window, shape)
    got = VerifyOp("triton").pick(*canvas.for_pick(), *window, shape)
    assert same_batch(got, expected), (got, expected)
    return expected


def check_pack(canvas: Canvas, batch: VerifyBatch, shape: VerifyShape):
    W, C = batch.tracked.shape[1], batch.cells.shape[1]
    chain = torch.tensor(chain_visibility(W, C, shape.shift), dtype=torch.bool, device=DEVICE)
    rows = TRASH_ROW + 1 + canvas.answer.shape[0] * shape.slot_len
    keep = (torch.rand(rows, generator=torch.Generator().manual_seed(W)) < 0.9).to(torch.int8).to(DEVICE)
    keep_expected, keep_got = keep.clone(), keep.clone()
    args = (canvas.answer, canvas.tokens, canvas.prompt_len, canvas.gen_len, canvas.row_base, chain)
    expected = verify_pack_reference(batch, *args, keep_expected, shape)
    got = VerifyOp("triton").pack(batch, *args, keep_got, shape)
    for field in dataclasses.fields(expected):
        a, b = getattr(got, field.name), getattr(expected, field.name)
        assert a.dtype == b.dtype and torch.equal(a, b), (field.name, a, b)
    assert torch.equal(keep_got, keep_expected)
    return expected


@pytest.mark.parametrize("W,cap", SIZES)
def test_pick_matches_the_reference(W, cap):
    G, L = 40, 64
    kept = 0
    for seed in range(5):
        canvas = random_canvas(S=6, G=G, L=L, seed=seed * 7 + W)
        batch = check_pick(canvas, random_window(canvas, W, seed), shape_for(cap, False, L))
        kept += int((batch.cells >= 0).sum())
    assert kept > 0


@pytest.mark.parametrize("values", [(0.0, -0.0, 0.5, 0.5, 1.0), (0.25, 0.25, 0.25),
                                    (0.0, -0.0, float("inf"), float("-inf"), float("nan"), 0.5)])
def test_pick_orders_equal_and_special_confidences_as_the_stable_sort(values):
    for W, cap in SIZES:
        canvas = random_canvas(S=5, G=32, L=48, seed=W)
        canvas.active.fill_(True)
        canvas.max_steps.fill_(1 << 40)
        canvas.answer[:, :] = -1  # every window cell still to decode: more candidates than the cap
        check_pick(canvas, random_window(canvas, W, W + 1, values), shape_for(cap, False, 48))


def test_pick_without_candidates_or_tracked_cells():
    canvas = random_canvas(S=4, G=24, L=40, seed=3, new_count=0)
    window = random_window(canvas, 16, 3)
    canvas.active.fill_(False)
    batch = check_pick(canvas, window, shape_for(8, False, 40))
    assert (batch.cells < 0).all() and (batch.tracked < 0).all()
    canvas.active.fill_(True)
    tokens = torch.full_like(window[1], MASK_ID)  # every draft [MASK]
    assert (check_pick(canvas, (window[0], tokens, window[2]), shape_for(8, False, 40)).cells < 0).all()


def test_tracked_cells_cross_chunks():
    """Answers longer than a chunk (512): the draft commit's cells past it, more than the window, or full."""
    for new_count in (3, 16, 40):
        canvas = random_canvas(S=3, G=1100, L=1200, seed=new_count, new_count=new_count)
        batch = check_pick(canvas, random_window(canvas, 16, new_count), shape_for(8, True, 1200))
        assert int((batch.tracked >= 0).sum(1).max()) == min(new_count, 16)


@pytest.mark.parametrize("shift,size", list(itertools.product([False, True], SIZES)))
def test_pack_matches_the_reference(shift, size):
    W, cap = size
    L = 64
    for seed in range(4):
        canvas = random_canvas(S=6, G=40, L=L, seed=seed * 5 + W)
        shape = shape_for(cap, shift, L)
        window = random_window(canvas, W, seed, (0.1, 0.3, 0.3, 0.9) if seed % 2 else None)
        check_pack(canvas, check_pick(canvas, window, shape), shape)


@pytest.mark.parametrize("shift", [False, True])
def test_pack_of_given_batches(shift):
    """Batches as the host reference builds them (drafts padded with [MASK]): neighbouring candidates in either
    order, a candidate at cell 0 of a prompt-less slot, tracked cells next to candidates, holes anywhere."""
    L = 48
    canvas = random_canvas(S=4, G=32, L=L, seed=11)
    canvas.prompt_len[1] = 0
    n = -1
    batch = VerifyBatch(
        tracked=torch.tensor([[4, 7, 8] + [n] * 13, [n] * 16, list(range(16)), [0, 1] + [n] * 14]),
        cells=torch.tensor([[6, 5, 9, 10, 3, n, n, n], [0, 1, 3, 2, n, n, n, n], [n] * 8, [5, n, 6, n, 4, n, 2, n]]),
        drafts=torch.tensor([[11, 12, 13, 14, 15] + [MASK_ID] * 3, [21, 22, 23, 24] + [MASK_ID] * 4,
                             [MASK_ID] * 8, [31, 0, 32, 0, 33, 0, 34, 0]]))
    check_pack(canvas, VerifyBatch(*(t.to(DEVICE) for t in dataclasses.astuple(batch))), shape_for(8, shift, L))


def random_predictions(batch: VerifyBatch, seed):
    """The mask views' predictions: the draft most of the time, confidences and probabilities near 1 (from a few
    values: long accepted prefixes and ties at gamma)."""
    gen = torch.Generator().manual_seed(seed)
    S, C = batch.cells.shape
    drafts = batch.drafts.cpu()
    tokens = torch.where(torch.rand(S, C, generator=gen) < 0.8, drafts, torch.randint(0, 100, (S, C), generator=gen))
    values = torch.tensor([1.0, 0.99, 0.97, 0.9, 0.8, 0.5], dtype=torch.float64)
    confidences = values[torch.randint(0, len(values), (S, C), generator=gen)]
    probs = torch.where(torch.rand(S, C, generator=gen) < 0.5, confidences,
                        1.0 - 0.1 * torch.rand(S, C, generator=gen, dtype=torch.float64))
    return tokens.reshape(-1).to(DEVICE), confidences.reshape(-1).to(DEVICE), probs.reshape(-1).to(DEVICE)


def gammas(probs: torch.Tensor, S: int, seed: int) -> torch.Tensor:
    """Per slot: the running product at a random candidate (computed as the reference does), or one ulp either
    side of it, or a plain threshold."""
    gen = torch.Generator().manual_seed(seed)
    running = torch.cumprod(probs.view(S, -1).cpu(), dim=1)
    at = running[torch.arange(S), torch.randint(0, running.shape[1], (S,), generator=gen)]
    pick = torch.randint(0, 4, (S,), generator=gen)
    up = torch.nextafter(at, torch.full_like(at, 2.0))
    down = torch.nextafter(at, torch.zeros_like(at))
    return torch.stack([at, up, down, torch.full_like(at, 0.8)])[pick, torch.arange(S)].to(DEVICE)


def check_accept(batch: VerifyBatch, predictions, gamma, active, rule: str):
    S = batch.cells.shape[0]
    gen = torch.Generator().manual_seed(S)
    counters = VerifyCounters(*(torch.randint(0, 50, (S,), generator=gen).to(DEVICE) for _ in range(4)))
    expected_counters = VerifyCounters(*(t.clone() for t in dataclasses.astuple(counters)))
    expected = verify_accept_reference(batch, *predictions, gamma, active, expected_counters, rule)
    got = VerifyOp("triton").accept(batch, *predictions, gamma, active, counters, rule)
    assert torch.equal(got.accepted, expected.accepted), (got.accepted, expected.accepted)
    assert torch.equal(got.chosen, expected.chosen)
    for a, b in zip(dataclasses.astuple(counters), dataclasses.astuple(expected_counters)):
        assert torch.equal(a, b)
    return expected


@pytest.mark.parametrize("rule,size", list(itertools.product(["paper", "cumulative"], SIZES)))
def test_accept_matches_the_reference(rule, size):
    W, cap = size
    accepted = rejected = 0
    for seed in range(5):
        canvas = random_canvas(S=8, G=40, L=64, seed=seed * 3 + W)
        batch = check_pick(canvas, random_window(canvas, W, seed), shape_for(cap, False, 64))
        predictions = random_predictions(batch, seed)
        gamma = gammas(predictions[1] if rule == "paper" else predictions[2], 8, seed)
        active = canvas.active.clone()
        active[0] = False  # a slot with candidates but no pass (a batch not picked from this canvas)
        outcome = check_accept(batch, predictions, gamma, active, rule)
        accepted += int(outcome.accepted.sum())
        rejected += int(((batch.cells >= 0).sum(1) - outcome.accepted).clamp(min=0).sum())
    assert accepted > 0 and rejected > 0


def test_accept_of_holes_and_empty_slots():
    """Holes in the middle of a batch stop the prefix; a slot with no candidate runs no pass."""
    n = -1
    batch = VerifyBatch(tracked=torch.full((3, 4), -1, device=DEVICE),
                        cells=torch.tensor([[3, 4, n, 6], [n, n, n, n], [1, 2, 3, 4]], device=DEVICE),
                        drafts=torch.tensor([[5, 6, 7, 8], [5, 6, 7, 8], [5, 6, 7, 8]], device=DEVICE))
    predictions = (batch.drafts.reshape(-1).clone(), torch.ones(12, dtype=torch.float64, device=DEVICE),
                   torch.ones(12, dtype=torch.float64, device=DEVICE))
    active = torch.ones(3, dtype=torch.bool, device=DEVICE)
    for rule in ("paper", "cumulative"):
        gamma = torch.full((3,), 0.5, dtype=torch.float64, device=DEVICE)
        outcome = check_accept(batch, predictions, gamma, active, rule)
        assert outcome.accepted.tolist() == [2, 0, 4]
