"""Scheduled attention (split-KV Triton path) vs the per-sequence PyTorch reference.

Runs the Triton kernels through the CPU interpreter (TRITON_INTERPRET=1, small shapes) or, with
TRITON_INTERPRET=0 on a CUDA machine, on the GPU, where LLaDA-8B / Dream-7B shapes, CUDA-graph replay and the
no-recompilation check also run.

Tolerances (relative Frobenius-norm error vs the reference), for the output and for score_out:
  fp32 1e-5; fp16 2e-3; bf16 1e-2 (one rounding of the output on each side; on the GPU the kernel also
  feeds bf16 probabilities to the P.V product, and the interpreter stores bf16 by truncation).
Split counts 1 (one pass), 2, 3 and 7 are forced; keys are split in granules of 64, so short sequences
leave some of 7 splits empty. Padding (static plans) and unused cache rows hold NaN: reading one as a real
query or key shows up as NaN.
"""
from kernel_testing import DEVICE, TOL, needs_gpu, needs_triton, rel_err  # noqa: F401  (sets TRITON_INTERPRET first)

import pytest  # noqa: E402
import torch  # noqa: E402

from flash_dllm.kernels._scheduled_attention_launcher import choose_splits  # noqa: E402
from flash_dllm.kernels.scheduled_attention import (ScheduledAttention, build_plan, scheduled_attention,  # noqa: E402
                                                    scheduled_attention_reference, static_plan)

pytestmark = needs_triton
SPLITS = [1, 2, 3, 7]


class Batch:
    """A packed ragged batch (build_plan): sequence b owns cache slot b (keys first, then in-query scratch)."""

    def __init__(self, q_lens, kv_lens, n_heads, n_kv_heads, head_dim, dtype, block_m=32, keep_prob=None,
                 in_query=False, score_prob=None, seed=0):
        gen = torch.Generator().manual_seed(seed)
        self.n_heads, self.n_kv_heads, self.head_dim, self.dtype = n_heads, n_kv_heads, head_dim, dtype
        slot = max(kv_lens) + max(q_lens) + 8
        n_rows, n_queries = len(q_lens) * slot, sum(q_lens)
        self.q = torch.randn(n_queries, n_heads * head_dim, generator=gen).to(DEVICE, dtype)
        self.k_cache = torch.randn(n_rows, n_kv_heads * head_dim, generator=gen).to(DEVICE, dtype)
        self.v_cache = torch.randn(n_rows, n_kv_heads * head_dim, generator=gen).to(DEVICE, dtype)
        kv_keep = (torch.rand(n_rows, generator=gen) > keep_prob).to(DEVICE, torch.int8) if keep_prob else None
        inq_starts = [b * slot + kv for b, kv in enumerate(kv_lens)] if in_query else None
        inq_mask = (torch.rand(n_queries, max(q_lens), generator=gen) > 0.5).to(DEVICE) if in_query else None
        score_query = (torch.rand(n_queries, generator=gen) < score_prob).to(DEVICE) if score_prob else None
        self.score_init = torch.rand(n_rows, generator=gen).to(DEVICE)  # score_out accumulates into this
        self.plan = build_plan(q_lens, [b * slot for b in range(len(q_lens))], kv_lens, DEVICE, block_m=block_m,
                               kv_keep=kv_keep, inq_starts=inq_starts, inq_mask=inq_mask, score_query=score_query)

    @property
    def valid(self) -> torch.Tensor:
        """Packed rows that are real queries (padding rows' outputs are unspecified)."""
        return torch.ones(self.q.shape[0], dtype=torch.bool, device=DEVICE)

    def op(self, n_splits=None, **kwargs) -> ScheduledAttention:
        return ScheduledAttention("triton", self.n_heads, self.n_kv_heads, self.head_dim, check_inputs=True,
                                  n_splits=n_splits, **kwargs)

    def run(self, op=None, with_score: bool = False):
        """op(...) or, without one, the reference."""
        score = self.score_init.clone() if with_score else None
        if op is None:
            out = scheduled_attention_reference(self.q, self.k_cache, self.v_cache, self.plan, self.n_heads,
                                                self.n_kv_heads, score)
        else:
            out = op(self.q, self.k_cache, self.v_cache, self.plan, score)
        return out, score


class StaticBatch(Batch):
    """A static_plan batch: sequence b owns packed rows [b*rows_per_seq, +q_len[b]) and cache slot b
    (max_kv_len cache rows, then rows_per_seq in-query scratch rows). Padding query rows, cache rows past
    kv_len and scratch rows past q_len hold `fill` (None: leave them random); padding rows' score_query /
    inq_mask entries are set to `pad_flag`."""

    def __init__(self, q_lens, kv_lens, rows_per_seq, max_kv_len, n_heads, n_kv_heads, head_dim, dtype,
                 block_m=16, keep_prob=None, in_query=False, score_prob=None, fill=float("nan"), pad_flag=True,
                 seed=0):
        gen = torch.Generator().manual_seed(seed)
        self.n_heads, self.n_kv_heads, self.head_dim, self.dtype = n_heads, n_kv_heads, head_dim, dtype
        n_seqs, slot = len(q_lens), max_kv_len + rows_per_seq
        n_queries, n_rows = n_seqs * rows_per_seq, n_seqs * slot
        q = torch.randn(n_queries, n_heads * head_dim, generator=gen)
        k_cache = torch.randn(n_rows, n_kv_heads * head_dim, generator=gen)
        v_cache = torch.randn(n_rows, n_kv_heads * head_dim, generator=gen)
        kv_keep = (torch.rand(n_rows, generator=gen) > keep_prob).to(torch.int8) if keep_prob else None
        inq_mask = torch.rand(n_queries, rows_per_seq, generator=gen) > 0.5
        score_query = torch.rand(n_queries, generator=gen) < (score_prob or 0.0)
        self.score_init = torch.rand(n_rows, generator=gen).to(DEVICE)
        pad_q = torch.ones(n_queries, dtype=torch.bool)
        used = torch.zeros(n_rows, dtype=torch.bool)
        for b, (n, kv) in enumerate(zip(q_lens, kv_lens)):
            pad_q[b * rows_per_seq : b * rows_per_seq + n] = False
            used[b * slot : b * slot + kv] = True
            used[b * slot + max_kv_len : b * slot + max_kv_len + n] = in_query
        if fill is not None:
            q[pad_q], k_cache[~used], v_cache[~used] = fill, fill, fill
        inq_mask[pad_q], score_query[pad_q] = pad_flag, pad_flag
        self.q, self.k_cache, self.v_cache = (t.to(DEVICE, dtype) for t in (q, k_cache, v_cache))
        ints = lambda values: torch.tensor(values, dtype=torch.int32, device=DEVICE)  # noqa: E731
        self.rows_per_seq, self.slot = rows_per_seq, slot
        self.plan = static_plan(
            n_seqs, rows_per_seq, block_m, max_kv_len, ints(q_lens), ints([b * slot for b in range(n_seqs)]),
            ints(kv_lens), DEVICE, kv_keep=kv_keep.to(DEVICE) if kv_keep is not None else None,
            inq_start=ints([b * slot + max_kv_len for b in range(n_seqs)]) if in_query else None,
            inq_mask=inq_mask.to(DEVICE) if in_query else None,
            score_query=score_query.to(DEVICE) if score_prob else None)

    @property
    def valid(self) -> torch.Tensor:
        local = torch.arange(self.q.shape[0], device=DEVICE) % self.rows_per_seq
        return local < self.plan.q_len.repeat_interleave(self.rows_per_seq)


def check(batch: Batch, op: ScheduledAttention, with_score: bool = False):
    out, score = batch.run(op, with_score)
    out_ref, score_ref = batch.run(None, with_score)
    tol, valid = TOL[batch.dtype], batch.valid
    assert out.dtype == batch.q.dtype and out.shape == batch.q.shape
    assert torch.isfinite(out[valid].float()).all()
    assert rel_err(out[valid], out_ref[valid]) <= tol, ("out", rel_err(out[valid], out_ref[valid]))
    if with_score:
        assert torch.isfinite(score).all()
        assert rel_err(score - batch.score_init, score_ref - batch.score_init) <= tol, "score_out"
    return out, out_ref, score, score_ref


@pytest.mark.parametrize("n_splits", [1, 3])
@pytest.mark.parametrize("n_heads,n_kv_heads,head_dim", [(4, 4, 16), (4, 2, 32)], ids=["mha", "gqa"])
def test_ragged_batch_matches_reference(n_heads, n_kv_heads, head_dim, n_splits):
    """A 1-token sequence, a 37-token one and a 300-token one, each with its own kv length."""
    batch = Batch([1, 37, 300], [50, 300, 129], n_heads, n_kv_heads, head_dim, torch.float32)
    check(batch, batch.op(n_splits))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_half_precisions(dtype):
    batch = Batch([3, 40], [70, 130], 4, 2, 32, dtype, keep_prob=0.2, in_query=True, score_prob=0.5)
    check(batch, batch.op(2), True)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=["fp16", "bf16", "fp32"])
def test_split_partials_are_kept_in_the_input_dtype(dtype):
    """The parts' outputs go to the workspace in the inputs' dtype when it is 16-bit (half the bytes of fp32) and
    in fp32 otherwise or when forced; the 16-bit partials cost at most one more rounding of each part than fp32
    ones, and the row statistics stay fp32 in a buffer of their own."""
    batch = Batch([3, 40, 90], [700, 130, 400], 4, 2, 32, dtype, keep_prob=0.2, in_query=True, score_prob=0.5)
    results = {}
    for forced in (False, True):
        op = batch.op(3)
        op.triton.fp32_partials = forced
        out, out_ref, _, _ = check(batch, op, True)
        bucket = op.triton.bucket(batch.q, batch.plan, batch.score_init)
        assert bucket.acc_ws.dtype == (torch.float32 if forced or dtype == torch.float32 else dtype)
        assert bucket.m_ws.dtype == bucket.l_ws.dtype == torch.float32
        ws_bytes = bucket.acc_ws.numel() * bucket.acc_ws.element_size()
        assert not (bucket.acc_ws.data_ptr() <= bucket.m_ws.data_ptr() < bucket.acc_ws.data_ptr() + ws_bytes)
        results[forced] = rel_err(out[batch.valid], out_ref[batch.valid])
    assert results[False] <= results[True] + torch.finfo(dtype).eps, results


@pytest.mark.parametrize("n_splits", [1, 3])
@pytest.mark.parametrize("block_m", [16, 24, 64])
def test_tile_heights(block_m, n_splits):
    """The default 16, a height that is not a power of two (tile rows masked inside a 32-row block), 64 (about
    25 score rows in the 50-row sequence's tile)."""
    batch = Batch([5, 50, 17], [33, 90, 0], 4, 2, 16, torch.float32, block_m=block_m, in_query=True,
                  score_prob=0.5)
    check(batch, batch.op(n_splits), with_score=True)  # a row counted by two tiles would add its mass twice


def test_kv_keep_excludes_rows():
    batch = Batch([9, 20], [80, 150], 4, 2, 16, torch.float32, keep_prob=0.4)
    out, *_ = check(batch, batch.op(2))
    batch.plan.kv_keep = None  # the same batch with every row visible must give a different answer
    assert rel_err(out, batch.run(batch.op(2))[0]) > 1e-2


@pytest.mark.parametrize("n_splits", [1, 3])
def test_query_with_no_visible_key_outputs_zero(n_splits):
    """Sequence 1 has every cache row excluded and no in-query keys; sequence 2 has no cache keys at all."""
    batch = Batch([4, 6, 5], [40, 30, 0], 2, 2, 16, torch.float32, keep_prob=0.3, score_prob=0.5)
    start1, len1 = batch.plan.host_kv_start[1], batch.plan.host_kv_len[1]
    batch.plan.kv_keep[start1 : start1 + len1] = 0
    out, *_ = check(batch, batch.op(n_splits), with_score=True)
    assert torch.equal(out[4:15], torch.zeros_like(out[4:15]))
    assert out[:4].abs().sum() > 0


@pytest.mark.parametrize("n_splits", [1, 3])
def test_in_query_keys_with_random_mask(n_splits):
    batch = Batch([7, 33, 20], [60, 0, 100], 4, 2, 16, torch.float32, in_query=True)
    batch.plan.inq_mask[7:12] = False  # 5 rows of a sequence without cache keys see nothing at all
    out, *_ = check(batch, batch.op(n_splits))
    assert torch.equal(out[7:12], torch.zeros_like(out[7:12]))
    batch.plan.inq_mask = None  # without the in-query keys the answer must change
    assert rel_err(out, batch.run(batch.op(n_splits))[0]) > 1e-2


def window_logit_sums(batch: Batch) -> torch.Tensor:
    """The attention mass by its definition, key by key in float64: for each sequence's kept cache key r,
    the sum over its score rows i and query heads h of q[i, h] . k[r, h // group] (unscaled)."""
    plan, group, dh = batch.plan, batch.n_heads // batch.n_kv_heads, batch.head_dim
    expected = torch.zeros(batch.k_cache.shape[0], dtype=torch.float64)
    for q0, n, k0, kl in zip(plan.host_q_start, plan.host_q_len, plan.host_kv_start, plan.host_kv_len):
        rows = [q0 + i for i in range(n) if bool(plan.score_query[q0 + i])]
        for r in range(k0, k0 + kl):
            if plan.kv_keep is not None and not bool(plan.kv_keep[r]):
                continue
            for h in range(batch.n_heads):
                key = batch.k_cache[r, (h // group) * dh : (h // group + 1) * dh].double().cpu()
                expected[r] += sum(float(batch.q[i, h * dh : (h + 1) * dh].double().cpu() @ key) for i in rows)
    return expected


def test_reference_mass_is_the_window_logit_sum():
    batch = Batch([3, 11], [20, 9], 4, 2, 8, torch.float32, keep_prob=0.3, in_query=True, score_prob=0.4)
    _, score = batch.run(None, with_score=True)
    expected = window_logit_sums(batch)
    assert expected.abs().sum() > 0
    assert torch.allclose((score - batch.score_init).double().cpu(), expected, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("n_splits", SPLITS)
def test_score_out_accumulates_attention_mass(n_splits):
    batch = Batch([1, 37, 70], [50, 200, 129], 4, 2, 16, torch.float32, keep_prob=0.2, in_query=True,
                  score_prob=0.4)
    _, _, score, score_ref = check(batch, batch.op(n_splits), with_score=True)
    added = score - batch.score_init
    assert added.abs().sum() > 0
    untouched = torch.ones_like(added, dtype=torch.bool)
    for start, length in zip(batch.plan.host_kv_start, batch.plan.host_kv_len):
        untouched[start : start + length] = False
    assert torch.equal(score[untouched], batch.score_init[untouched])  # in-query rows get no mass
    assert torch.equal(added[batch.plan.kv_keep == 0], torch.zeros_like(added[batch.plan.kv_keep == 0]))


def test_head_dim_128_with_everything():
    for dtype in (torch.float32, torch.bfloat16):
        batch = Batch([3, 6], [20, 45], 4, 1, 128, dtype, block_m=16, keep_prob=0.2, in_query=True, score_prob=0.5)
        check(batch, batch.op(2), True)


def test_empty_sequence_in_the_batch():
    batch = Batch([5, 0, 9], [20, 30, 40], 2, 1, 16, torch.float32, block_m=16, score_prob=0.5)
    check(batch, batch.op(3), True)


@pytest.mark.parametrize("n_heads,n_kv_heads,n_splits", [(4, 4, 1), (4, 2, 2), (4, 4, 3), (4, 2, 7)],
                         ids=["mha-1", "gqa-2", "mha-3", "gqa-7"])  # each count once, each geometry twice
def test_static_plan_matches_reference(n_heads, n_kv_heads, n_splits):
    """Padded rows, kv_len far below max_kv_len (600), a sequence with no cache keys, one whose 50 keys fill
    one granule (7 splits: six empty), a full 24-row budget (its second 16-row tile reaches past it into the
    next sequence's rows); exclusions, in-query keys and attention mass."""
    batch = StaticBatch([13, 24, 1, 22], [50, 333, 0, 190], 24, 600, n_heads, n_kv_heads, 16, torch.float32,
                        keep_prob=0.2, in_query=True, score_prob=0.3)
    check(batch, batch.op(n_splits), with_score=True)


def test_static_plan_ignores_padding_contents():
    """NaN vs large finite padding (queries, unused cache and scratch rows), padding rows flagged as score
    rows and as seeing every in-query key or not: the real rows' outputs and score_out do not change."""
    results = []
    for fill, pad_flag in ((float("nan"), True), (1e4, False)):
        batch = StaticBatch([13, 3], [150, 600], 32, 640, 4, 2, 16, torch.float32, keep_prob=0.1, in_query=True,
                            score_prob=0.3, fill=fill, pad_flag=pad_flag)
        out, score = batch.run(batch.op(3), with_score=True)
        results.append((out[batch.valid], score))
        check(batch, batch.op(3), with_score=True)
    assert torch.equal(results[0][0], results[1][0])
    if DEVICE == "cpu":  # the interpreter adds in program order; GPU atomics do not
        assert torch.equal(results[0][1], results[1][1])
    else:
        assert rel_err(results[0][1], results[1][1]) <= 1e-6


def test_static_plan_follows_tensors_rewritten_in_place():
    """What a CUDA-graph replay relies on: the same op and plan object, new q_len / kv_start / kv_len
    contents give the new answer from the same schedule (no new bucket, same workspace)."""
    batch = StaticBatch([5, 16, 9], [40, 300, 0], 16, 320, 4, 2, 16, torch.float32, keep_prob=0.2,
                        in_query=True, score_prob=0.3, fill=None)
    op = batch.op(3)
    check(batch, op, with_score=True)
    bucket = op.triton.bucket(batch.q, batch.plan, batch.score_init)
    batch.plan.q_len.copy_(torch.tensor([16, 1, 12]))
    batch.plan.kv_len.copy_(torch.tensor([299, 64, 7]))
    batch.plan.kv_start.copy_(torch.tensor([batch.slot, 0, 2 * batch.slot]))  # sequences 0 and 1 swap slots
    check(batch, op, with_score=True)
    assert op.triton.bucket(batch.q, batch.plan, batch.score_init) is bucket and len(op.triton._buckets) == 1


def test_split_count_fills_what_the_sms_hold_at_once():
    # (tiles, heads): a batch-1 flash-cache step makes 2 tiles for LLaDA (128 rows) and 3 for Dream (144 rows: the
    # shifted readout adds 16); a verify pass or a fast-dllm block makes 1 per sequence
    assert choose_splits(2, 32, 1312, 132) == 4  # LLaDA batch 1: 64 programs x 4 ~ 2 x 132 SMs
    assert choose_splits(3, 28, 1312, 132) == 3  # Dream batch 1: 84 x 3 = 252
    assert choose_splits(2, 28, 1312, 132) == 4  # Dream's verify / fast-dllm at batch 2: 56 x 4 = 224 <= 264 (x 5
    #                                              would put 16 programs in a second round)
    assert choose_splits(3, 32, 1312, 132) == 2  # LLaDA's verify / fast-dllm at batch 3: 96 x 3 would not fit
    assert choose_splits(6, 28, 1312, 132) == 2  # Dream flash-cache batch 2: 264 / 168 = 1.6 rounds to 2 (one
    #                                              split, every program walking all the keys, is slower)
    assert choose_splits(6, 32, 1312, 132) == 1  # 264 / 192 = 1.4
    assert choose_splits(4, 28, 1312, 132) == 2  # 112 x 2
    assert choose_splits(1, 32, 1312, 132) == 5  # 1 tile (a 48-row verify pass): 32 x 8 > 264, capped at 1312 // 256
    assert choose_splits(2, 32, 1312, 82) == 2  # 82 SMs holding two programs each: 164 // 64
    assert choose_splits(3, 28, 1312, 82) == 2  # Dream batch 1 there: 164 / 84 = 1.95
    # an RTX 3090 holds one split program per SM (tests/test_kernel_occupancy.py)
    assert choose_splits(2, 32, 1312, 82, waves=1) == 1  # 82 / 64 = 1.3: the tiles nearly fill it
    assert choose_splits(1, 32, 1312, 82, waves=1) == 2  # a 32-row verify pass / fast-dllm block: 82 // 32
    assert choose_splits(1, 28, 1312, 82, waves=1) == 2  # Dream's: 82 / 28 = 2.9 rounds down (>= two)
    assert choose_splits(16, 32, 1312, 132) == 1  # batch 8: the tiles alone make ~4 waves
    assert choose_splits(2, 32, 700, 132) == 2  # capped: each split keeps >= 256 keys
    assert choose_splits(2, 32, 200, 132) == 1
    assert choose_splits(0, 32, 1312, 132) == 1


def test_first_split_launch_reads_the_occupancy_and_schedules_again(monkeypatch):
    """Where the tuned config fits once per SM (an RTX 3090), the first split launch of a feature set finds out
    and makes its schedule again for half the programs, without adding the attention mass twice; later shapes
    with those features start from the known occupancy."""
    from flash_dllm.kernels import _scheduled_attention_launcher as launcher

    asked = []
    monkeypatch.setattr(launcher, "split_programs_per_sm", lambda args, grid, meta, device: asked.append(grid) or 1)
    batch = Batch([40], [1100], 4, 2, 16, torch.float32, block_m=32, score_prob=0.5)  # 2 tiles x 4 heads
    op = batch.op()
    first = op.triton.bucket(batch.q, batch.plan, batch.score_init)
    assert first.provisional and first.n_splits == 4  # 2 x 16 interpreter SMs / 8 programs
    check(batch, op, with_score=True)
    settled = op.triton.bucket(batch.q, batch.plan, batch.score_init)
    assert not settled.provisional and settled.n_splits == 2 and asked == [first.split_grid]  # 16 / 8
    check(batch, op, with_score=True)
    longer = Batch([40], [1300], 4, 2, 16, torch.float32, block_m=32, score_prob=0.5, seed=1)  # a new bucket
    bucket = op.triton.bucket(longer.q, longer.plan, longer.score_init)
    assert not bucket.provisional and bucket.n_splits == 2
    check(longer, op, with_score=True)
    plain = op.triton.bucket(longer.q, longer.plan)  # other features: their own tuned config, not known yet
    assert plain.provisional and len(asked) == 1


def test_unknown_occupancy_keeps_the_schedule():
    """In the interpreter (or where Triton cannot say) the first launch keeps WAVES' split count."""
    batch = Batch([40], [1100], 4, 2, 16, torch.float32, block_m=32)
    op = batch.op()
    first = op.triton.bucket(batch.q, batch.plan)
    check(batch, op)
    settled = op.triton.bucket(batch.q, batch.plan)
    assert first.provisional and not settled.provisional and settled.n_splits == first.n_splits == 4


def test_default_schedule_splits_long_sequences():
    """Without a forced count the interpreter's made-up 16-SM machine splits 1 tile x 2 heads x 1,100 keys
    4 ways (the 256-key cap); the result still matches."""
    batch = Batch([20], [1100], 2, 1, 16, torch.float32, block_m=32, keep_prob=0.1, in_query=True, score_prob=0.5)
    op = batch.op()
    assert op.key_splits(batch.q, batch.plan, batch.score_init) == 4
    check(batch, op, with_score=True)


def test_op_binds_backend_and_checks_inputs():
    with pytest.raises(ValueError, match="unknown kernel backend"):
        ScheduledAttention("cuda", 4, 2, 16)
    batch = Batch([5, 9], [30, 70], 4, 2, 16, torch.float32, score_prob=0.5)
    out, score = batch.run(ScheduledAttention("torch", 4, 2, 16), with_score=True)
    out_ref, score_ref = batch.run(None, with_score=True)
    assert torch.equal(out, out_ref) and torch.equal(score, score_ref)
    functional = scheduled_attention(batch.q, batch.k_cache, batch.v_cache, batch.plan, 4, 2, backend="triton")
    assert rel_err(functional, out_ref) <= TOL[torch.float32]
    with pytest.raises(ValueError, match="caches must be"):
        batch.op()(batch.q, batch.k_cache[:, :16], batch.v_cache[:, :16], batch.plan)
    with pytest.raises(ValueError, match="score_out"):
        batch.op()(batch.q, batch.k_cache, batch.v_cache, batch.plan, batch.score_init.double())


def test_grown_workspace_keeps_earlier_schedules_valid():
    """A bigger plan grows the shared workspace; the smaller plan's schedule (as a captured graph would)
    still points at its own, still-allocated buffer and still gives the right answer."""
    small = StaticBatch([7], [300], 16, 320, 4, 2, 16, torch.float32, score_prob=0.3)
    big = StaticBatch([30, 20, 9], [500, 64, 300], 32, 520, 4, 2, 16, torch.float32, score_prob=0.3, seed=1)
    op = small.op(3)
    check(small, op, True)
    first = op.triton.bucket(small.q, small.plan, small.score_init)
    check(big, op, True)
    assert op.triton.bucket(big.q, big.plan, big.score_init).acc_ws.data_ptr() != first.acc_ws.data_ptr()
    check(small, op, True)
    assert op.triton.bucket(small.q, small.plan, small.score_init) is first


# ---- full model geometry (GPU only) ------------------------------------------------------------------------

MODELS = {"llada-8b": (32, 32), "dream-7b": (28, 4)}  # query heads, kv heads; head dim 128


@needs_gpu
@pytest.mark.parametrize("block_m", [64, 128])
@pytest.mark.parametrize("model", sorted(MODELS))
def test_full_shapes_bf16(model, block_m):
    """One 1024-token prefill beside 7 refreshes of 128 queries over 1000..4096 keys, with every feature."""
    n_heads, n_kv_heads = MODELS[model]
    kv_lens = [1024, 1000, 1500, 2048, 2500, 3000, 3600, 4096]
    batch = Batch([1024] + [128] * 7, kv_lens, n_heads, n_kv_heads, 128, torch.bfloat16, block_m=block_m,
                  keep_prob=0.1, in_query=True, score_prob=0.5)
    check(batch, batch.op(), with_score=True)


def decode_step(model: str, n_seqs: int, in_query: bool = False, fill=float("nan")) -> StaticBatch:
    """Flash-Cache's step: 128 rows per sequence (~16 scored) over 1,250..1,350 keys of a 2,048-key slot."""
    n_heads, n_kv_heads = MODELS[model]
    kv_lens = torch.randint(1250, 1351, (n_seqs,), generator=torch.Generator().manual_seed(n_seqs)).tolist()
    return StaticBatch([128] * n_seqs, kv_lens, 128, 2048, n_heads, n_kv_heads, 128, torch.bfloat16, block_m=64,
                       keep_prob=0.05, in_query=in_query, score_prob=0.125, fill=fill)


@needs_gpu
@pytest.mark.parametrize("n_seqs", [1, 8, 32])
@pytest.mark.parametrize("model", sorted(MODELS))
def test_decode_step_full_shapes_bf16(model, n_seqs):
    batch = decode_step(model, n_seqs, in_query=n_seqs == 1)
    op = batch.op(n_splits=4 if n_seqs == 1 else None)  # batch 1 takes the split path on every GPU
    check(batch, op, with_score=True)


@needs_gpu
@pytest.mark.parametrize("model", sorted(MODELS))
def test_split_count_follows_the_tuned_configs_occupancy_on_the_gpu(model, monkeypatch):
    """The first split launch reads how many programs of its tuned config an SM holds (Triton's compiled kernel
    and the device's limits) and the schedule fills that many per SM (at most WAVES)."""
    from flash_dllm.kernels import _scheduled_attention_launcher as launcher

    read, real = [], launcher.split_programs_per_sm
    monkeypatch.setattr(launcher, "split_programs_per_sm", lambda *args: read.append(real(*args)) or read[-1])
    batch = decode_step(model, 1)
    op = batch.op()
    check(batch, op, with_score=True)
    assert len(read) == 1 and read[0] is not None and 1 <= read[0] <= 32, read
    waves = min(launcher.WAVES, read[0])
    n_sms = torch.cuda.get_device_properties(DEVICE).multi_processor_count
    expected = choose_splits(batch.plan.tile_seq.shape[0], batch.n_heads, batch.plan.max_kv_len, n_sms, waves)
    assert op.key_splits(batch.q, batch.plan, batch.score_init) == expected
    print(f"{torch.cuda.get_device_name()}: {read[0]} split programs per SM, {expected} key splits")


@needs_gpu
@pytest.mark.parametrize("model", sorted(MODELS))
def test_cuda_graph_replay_follows_rewritten_plan(model):
    """Capture once; each replay after rewriting q, q_len, kv_len and kv_start in place matches the reference."""
    batch = decode_step(model, 2, fill=None)
    op, score = batch.op(), torch.zeros_like(batch.score_init)
    op(batch.q, batch.k_cache, batch.v_cache, batch.plan, score)  # eager: schedule, workspace, compile, tune
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = op(batch.q, batch.k_cache, batch.v_cache, batch.plan, score)
    gen = torch.Generator().manual_seed(5)
    for q_lens, kv_lens, swap in (([128, 100], [1312, 900], False), ([7, 128], [300, 2048], True)):
        batch.plan.q_len.copy_(torch.tensor(q_lens))
        batch.plan.kv_len.copy_(torch.tensor(kv_lens))
        batch.plan.kv_start.copy_(torch.tensor([batch.slot, 0] if swap else [0, batch.slot]))
        batch.q.copy_(torch.randn(batch.q.shape, generator=gen))
        score.zero_()
        graph.replay()
        batch.score_init = torch.zeros_like(score)
        out_ref, score_ref = batch.run(None, with_score=True)
        assert rel_err(out[batch.valid], out_ref[batch.valid]) <= TOL[torch.bfloat16]
        assert rel_err(score, score_ref) <= TOL[torch.bfloat16]


def compiled_variants(kernel) -> int:
    fn = kernel
    while not hasattr(fn, "device_caches"):  # the autotuner holds the JITFunction in .fn
        fn = fn.fn
    return sum(len(entry[0]) for entry in fn.device_caches.values())


@needs_gpu
@pytest.mark.parametrize("n_splits", [1, 3])
def test_plan_sizes_do_not_recompile(n_splits):
    from flash_dllm.kernels._scheduled_attention_triton import _attention_combine_kernel, _attention_split_kernel

    counts = []
    for q_lens, kv_lens in (([128, 64], [1000, 2000]), ([4, 300, 128], [77, 4000, 129]), ([1], [5])):
        batch = Batch(q_lens, kv_lens, 28, 4, 128, torch.bfloat16, block_m=64, in_query=True, score_prob=0.2)
        batch.run(batch.op(n_splits), with_score=True)
        counts.append(compiled_variants(_attention_split_kernel) + compiled_variants(_attention_combine_kernel))
    assert counts[0] >= 1 and counts[1:] == counts[:1] * 2, counts
