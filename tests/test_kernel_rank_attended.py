"""Flash-Cache's attention ranking kernel (kernels/rank_attended.py) against its reference, bit for bit.

Random masses over prompt and answer positions (committed and masked cells, positions past the answer), exact
ties (which go to the lower position), -0.0 against +0.0, -inf masses, inactive sequences that keep their old
ranking, budgets above and below the number of eligible positions, slots longer than one chunk. Runs through the
CPU interpreter (TRITON_INTERPRET=1) or compiled on a CUDA machine.
"""
from kernel_testing import DEVICE, needs_triton  # noqa: F401  (sets TRITON_INTERPRET first)

import pytest  # noqa: E402
import torch  # noqa: E402

from flash_dllm.kernels.rank_attended import RankAttended, rank_attended_reference  # noqa: E402

pytestmark = needs_triton


def random_case(S, G, L, T, seed, ties=False):
    gen = torch.Generator().manual_seed(seed)
    row_base = 3 + torch.arange(S) * L
    n_rows = 3 + S * L - 5  # the last slot's final rows fall past the end: clamped to the last row
    scores = torch.randn(n_rows, generator=gen)
    if ties:  # few distinct values, both zeros, some -inf
        scores = torch.randint(-2, 3, (n_rows,), generator=gen).float() * 0.5
        scores[torch.rand(n_rows, generator=gen) < 0.2] = -0.0
        scores[torch.rand(n_rows, generator=gen) < 0.05] = float("-inf")
    prompt_len = torch.randint(0, L - G + 1, (S,), generator=gen)
    gen_len = torch.randint(1, G + 1, (S,), generator=gen)
    answer = torch.where(torch.rand(S, G, generator=gen) < 0.5, -1, 7)
    active = torch.rand(S, generator=gen) < 0.8
    attended = torch.randint(-1, L, (S, T), generator=gen)
    return [t.to(DEVICE) for t in (scores, row_base, prompt_len, gen_len, answer, active, attended)]


def check(case, L):
    *inputs, attended = case
    expected = rank_attended_reference(*inputs, attended.clone(), L)
    got = RankAttended("triton")(*inputs, attended.clone(), L)
    assert torch.equal(got, expected), (got, expected)
    return expected


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("T", [1, 5, 16, 64])
def test_ranking_matches_the_reference(T, ties):
    for seed in range(3):
        check(random_case(S=5, G=30, L=70, T=T, seed=seed * 11 + T, ties=ties), 70)


def test_slots_longer_than_a_chunk():
    check(random_case(S=2, G=300, L=1400, T=64, seed=4, ties=True), 1400)
    check(random_case(S=2, G=300, L=1400, T=64, seed=5), 1400)


def test_ties_go_to_the_lower_position():
    scores = torch.zeros(20, device=DEVICE)
    scores[[4, 9, 12]] = 1.0
    scores[15] = -0.0
    one = lambda v: torch.tensor([v], device=DEVICE)  # noqa: E731
    attended = torch.full((1, 6), -1, device=DEVICE)
    answer = torch.zeros((1, 10), dtype=torch.int64, device=DEVICE)
    got = RankAttended("triton")(scores, one(0), one(10), one(10), answer, one(True), attended, 20)
    assert got.tolist() == [[4, 9, 12, 0, 1, 2]]
