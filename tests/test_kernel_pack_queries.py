"""The query-packing kernel (kernels/pack_queries.py) against its tensor-operation reference, bit for bit.

Random plans over odd shapes: budgets that cut a slot's positions short and budgets with padding rows, a
forward of some slots in another order, scored rows or none, Dream's shifted read-out, classifier-free
guidance's masked prompt, absent candidates and candidates whose read position is not recomputed. Runs through
the CPU interpreter (TRITON_INTERPRET=1) or compiled on a CUDA machine.
"""
from kernel_testing import DEVICE, needs_triton  # noqa: F401  (sets TRITON_INTERPRET first)

import itertools  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from flash_dllm.kernels.pack_queries import PackConstants, PackQueries, pack_queries_reference  # noqa: E402

pytestmark = needs_triton

FIELDS = ("token_ids", "positions", "write_rows", "score_query", "hidden_rows", "q_len", "kv_start", "kv_len")


def random_case(S, L, R, density, seed):
    gen = torch.Generator().manual_seed(seed)
    in_query = torch.rand(S, L, generator=gen) < density
    tokens = torch.randint(0, 1000, (S, L + 1), generator=gen)
    prompt_len = torch.randint(0, L // 2, (S,), generator=gen)
    row_base = 5 + torch.arange(S) * L
    total_len = torch.minimum(prompt_len + torch.randint(1, L, (S,), generator=gen), torch.full((S,), L))
    cells = torch.randint(-1, L // 2, (S, R), generator=gen)  # -1: absent
    scored = torch.rand(S, L, generator=gen) < 0.3
    on = lambda *ts: [t.to(DEVICE) for t in ts]  # noqa: E731
    return on(in_query, tokens, prompt_len, row_base, total_len, cells, scored)


def check(case, slots, budgets, scored, shift, mask_prompt):
    in_query, tokens, prompt_len, row_base, total_len, cells, scored_flags = case
    budgets = torch.tensor(budgets, device=DEVICE)
    offsets = torch.cumsum(budgets, 0) - budgets
    n_rows = int(budgets.sum())
    slots = None if slots is None else torch.tensor(slots, device=DEVICE)
    constants = PackConstants(mask_id=126336, trash_row=3, shift=shift)
    args = (in_query, tokens, prompt_len, row_base, total_len, cells, scored_flags if scored else None, slots,
            offsets, budgets, n_rows, constants, mask_prompt)
    expected = pack_queries_reference(*args)
    got = PackQueries("triton")(*args)
    for field in FIELDS:
        want, have = getattr(expected, field), getattr(got, field)
        if want is None:
            assert have is None, field
            continue
        assert have.dtype == want.dtype and have.shape == want.shape, field
        assert torch.equal(have, want), (field, have, want)
    return expected


@pytest.mark.parametrize("shift,mask_prompt,scored", list(itertools.product([False, True], repeat=3)))
def test_every_slot_in_order(shift, mask_prompt, scored):
    case = random_case(S=3, L=70, R=5, density=0.4, seed=1)
    packed = check(case, None, [40, 16, 24], scored, shift, mask_prompt)  # slot 0 cut short, others padded
    assert (packed.write_rows == 3).any() and (packed.q_len == torch.tensor([28, 16, 24], device=DEVICE)).any()


@pytest.mark.parametrize("L,block_crossing", [(1030, True), (2100, True), (33, False)])
def test_long_slots_cross_chunks(L, block_crossing):
    """Positions beyond the kernel's 1024-position chunk carry their rank over, and candidate reads count
    across the count chunks."""
    case = random_case(S=2, L=L, R=19, density=0.5, seed=L)
    check(case, None, [L // 2 + 7, 64], True, False, False)


def test_some_slots_in_another_order():
    case = random_case(S=5, L=90, R=4, density=0.3, seed=7)
    check(case, [3, 0, 4], [32, 48, 16], True, True, False)


def test_empty_slot_and_full_slot():
    in_query, *rest = random_case(S=2, L=40, R=3, density=0.5, seed=9)
    in_query = in_query.clone()
    in_query[0] = False  # a retired slot: nothing recomputed, every row padding, every read-out junk
    in_query[1] = True
    packed = check([in_query, *rest], None, [8, 40], False, False, False)
    assert packed.q_len.tolist() == [0, 40] and packed.hidden_rows[:3].tolist() == [0, 0, 0]
