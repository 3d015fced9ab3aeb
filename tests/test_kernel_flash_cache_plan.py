"""Flash-Cache's plan kernel (kernels/flash_cache_plan.py) against its tensor-operation reference, bit for bit.

Random canvases: masked and committed cells, the end token under both end rules, sequences on their first step,
out of steps or inactive; the previous step's commits (some inside the window set, the position before a window
cell included, so Dream's shift excludes them) and attended positions (some of them newly committed cells, some
in the window set) in numbers below and above the tracking budget. Runs through the CPU interpreter
(TRITON_INTERPRET=1) or compiled on a CUDA machine.
"""
from kernel_testing import DEVICE, needs_triton  # noqa: F401  (sets TRITON_INTERPRET first)

import itertools  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from flash_dllm.kernels.flash_cache_plan import (NOT_NEW, FlashCachePlanOp, PlanShape,  # noqa: E402
                                                 flash_cache_plan_reference)

pytestmark = needs_triton


def random_canvas(S, G, L, T, seed, new_fraction=0.1):
    gen = torch.Generator().manual_seed(seed)
    prompt_len = torch.randint(1, L - G + 1, (S,), generator=gen)
    gen_len = torch.randint(G // 2, G + 1, (S,), generator=gen)
    answer = torch.where(torch.rand(S, G, generator=gen) < 0.6, -1, torch.randint(0, 100, (S, G), generator=gen))
    newly = (answer >= 0) & (torch.rand(S, G, generator=gen) < new_fraction)
    newly_rank = torch.full((S, G), NOT_NEW, dtype=torch.int64)
    for s in range(S):  # commit orders 0..n-1 in a random order
        cells = newly[s].nonzero().flatten()
        newly_rank[s, cells] = torch.randperm(len(cells), generator=gen)
    attended = torch.full((S, T), -1, dtype=torch.int64)
    for s in range(S):
        n = int(torch.randint(0, T + 1, (1,), generator=gen))
        positions = torch.randperm(int(prompt_len[s] + gen_len[s]), generator=gen)[:n]
        attended[s, :len(positions)] = positions
    end = torch.where(torch.rand(S, generator=gen) < 0.5, torch.randint(0, G, (S,), generator=gen), gen_len)
    official_end = torch.rand(S, generator=gen) < 0.5
    steps = torch.randint(0, 4, (S,), generator=gen)
    max_steps = torch.where(torch.rand(S, generator=gen) < 0.2, steps, torch.full((S,), 1 << 40))
    active = torch.rand(S, generator=gen) < 0.85
    return [t.to(DEVICE) for t in (answer, newly_rank, attended, prompt_len, gen_len, end, official_end, steps,
                                   max_steps, active)]


def check(canvas, shape):
    expected = flash_cache_plan_reference(*canvas, shape)
    got = FlashCachePlanOp("triton")(*canvas, shape)
    assert torch.equal(got.cells, expected.cells)
    assert torch.equal(got.in_query, expected.in_query), (got.in_query ^ expected.in_query).nonzero()[:8]
    if expected.scored is None:
        assert got.scored is None
    else:
        assert torch.equal(got.scored, expected.scored)
    return expected


@pytest.mark.parametrize("shift,track", list(itertools.product([False, True], [-1, 0, 3, 8, 64])))
def test_plan_matches_the_reference(shift, track):
    for seed in range(4):
        canvas = random_canvas(S=6, G=40, L=90, T=max(track, 1), seed=seed * 7 + track, new_fraction=0.3)
        check(canvas, PlanShape(window=4, lookahead=6, track=track, shift=shift, slot_len=90))


def test_more_newly_committed_cells_than_the_budget():
    """Only the lowest commit orders are tracked when the previous step committed more cells than `track`."""
    canvas = random_canvas(S=4, G=64, L=120, T=4, seed=3, new_fraction=0.9)
    canvas[9] = torch.ones_like(canvas[9])  # all active
    canvas[7] = torch.full_like(canvas[7], 2)  # no first steps
    plan = check(canvas, PlanShape(window=2, lookahead=2, track=4, shift=False, slot_len=120))
    assert plan.in_query.sum() > 0


def test_long_canvases_cross_chunks():
    canvas = random_canvas(S=2, G=600, L=1300, T=64, seed=5)
    check(canvas, PlanShape(window=16, lookahead=48, track=64, shift=True, slot_len=1300))
