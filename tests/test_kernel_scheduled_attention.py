"""Scheduled (block-table) attention kernel vs the per-sequence PyTorch reference.

Runs the Triton kernel through the CPU interpreter (TRITON_INTERPRET=1, small shapes) or, with
TRITON_INTERPRET=0 on a CUDA machine, on the GPU, where LLaDA-8B / Dream-7B shapes also run.

Tolerances (relative Frobenius-norm error vs the reference), for the output and for score_out:
  fp32 1e-5; fp16 2e-3; bf16 1e-2 (one rounding of the output on each side; on the GPU the kernel also
  feeds bf16 probabilities to the P.V product, and the interpreter stores bf16 by truncation).
"""
from kernel_testing import DEVICE, TOL, needs_gpu, needs_triton, rel_err  # noqa: F401  (sets TRITON_INTERPRET first)

import pytest  # noqa: E402
import torch  # noqa: E402

from flash_dllm.kernels.scheduled_attention import build_plan, scheduled_attention, scheduled_attention_reference  # noqa: E402

pytestmark = needs_triton


class Batch:
    """A packed ragged batch: sequence b owns cache slot b (keys first, then its in-query scratch rows)."""

    def __init__(self, q_lens, kv_lens, n_heads, n_kv_heads, head_dim, dtype, block_m=32, keep_prob=None,
                 in_query=False, score_prob=None, seed=0):
        gen = torch.Generator().manual_seed(seed)
        self.n_heads, self.n_kv_heads, self.dtype = n_heads, n_kv_heads, dtype
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

    def run(self, backend: str, with_score: bool = False):
        score = self.score_init.clone() if with_score else None
        args = (self.q, self.k_cache, self.v_cache, self.plan, self.n_heads, self.n_kv_heads, score)
        out = scheduled_attention(*args, backend=backend) if backend == "triton" else scheduled_attention_reference(*args)
        return out, score


def check(batch: Batch, with_score: bool = False):
    out, score = batch.run("triton", with_score)
    out_ref, score_ref = batch.run("reference", with_score)
    tol = TOL[batch.dtype]
    assert out.dtype == batch.q.dtype and out.shape == batch.q.shape
    assert torch.isfinite(out.float()).all()
    assert rel_err(out, out_ref) <= tol, ("out", rel_err(out, out_ref))
    if with_score:
        assert rel_err(score - batch.score_init, score_ref - batch.score_init) <= tol, "score_out"
    return out, out_ref, score, score_ref


@pytest.mark.parametrize("n_heads,n_kv_heads,head_dim", [(4, 4, 16), (4, 2, 32)], ids=["mha", "gqa"])
def test_ragged_batch_matches_reference(n_heads, n_kv_heads, head_dim):
    """A 1-token sequence, a 37-token one and a 300-token one, each with its own kv length."""
    check(Batch([1, 37, 300], [50, 300, 129], n_heads, n_kv_heads, head_dim, torch.float32))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_half_precisions(dtype):
    check(Batch([3, 40], [70, 130], 4, 2, 32, dtype, keep_prob=0.2, in_query=True, score_prob=0.5), True)


@pytest.mark.parametrize("block_m", [16, 24, 64])
def test_tile_heights(block_m):
    """The default 16, a height that is not a power of two (tile rows masked inside a 32-row block), 64."""
    check(Batch([5, 50, 17], [33, 90, 0], 4, 2, 16, torch.float32, block_m=block_m, in_query=True, score_prob=0.5),
          with_score=True)  # a row counted by two tiles would add its mass twice


def test_kv_keep_excludes_rows():
    batch = Batch([9, 20], [80, 150], 4, 2, 16, torch.float32, keep_prob=0.4)
    out, *_ = check(batch)
    batch.plan.kv_keep = None  # the same batch with every row visible must give a different answer
    assert rel_err(out, batch.run("triton")[0]) > 1e-2


def test_query_with_no_visible_key_outputs_zero():
    """Sequence 1 has every cache row excluded and no in-query keys; sequence 2 has no cache keys at all."""
    batch = Batch([4, 6, 5], [40, 30, 0], 2, 2, 16, torch.float32, keep_prob=0.3)
    start1, len1 = batch.plan.host_kv_start[1], batch.plan.host_kv_len[1]
    batch.plan.kv_keep[start1 : start1 + len1] = 0
    out, *_ = check(batch)
    assert torch.equal(out[4:15], torch.zeros_like(out[4:15]))
    assert out[:4].abs().sum() > 0


def test_in_query_keys_with_random_mask():
    batch = Batch([7, 33, 20], [60, 0, 100], 4, 2, 16, torch.float32, in_query=True)
    batch.plan.inq_mask[7:12] = False  # 5 rows of a sequence without cache keys see nothing at all
    out, *_ = check(batch)
    assert torch.equal(out[7:12], torch.zeros_like(out[7:12]))
    batch.plan.inq_mask = None  # without the in-query keys the answer must change
    assert rel_err(out, batch.run("triton")[0]) > 1e-2


def test_score_out_accumulates_attention_mass():
    batch = Batch([1, 37, 70], [50, 200, 129], 4, 2, 16, torch.float32, keep_prob=0.2, in_query=True,
                  score_prob=0.4)
    _, _, score, score_ref = check(batch, with_score=True)
    added = score - batch.score_init
    assert added.sum() > 0
    untouched = torch.ones_like(added, dtype=torch.bool)
    for start, length in zip(batch.plan.host_kv_start, batch.plan.host_kv_len):
        untouched[start : start + length] = False
    assert torch.equal(score[untouched], batch.score_init[untouched])  # in-query rows get no mass
    assert torch.equal(added[batch.plan.kv_keep == 0], torch.zeros_like(added[batch.plan.kv_keep == 0]))


def test_head_dim_128_with_everything():
    for dtype in (torch.float32, torch.bfloat16):
        check(Batch([3, 6], [20, 45], 4, 1, 128, dtype, block_m=16, keep_prob=0.2, in_query=True, score_prob=0.5),
              True)


def test_empty_sequence_in_the_batch():
    check(Batch([5, 0, 9], [20, 30, 40], 2, 1, 16, torch.float32, block_m=16, score_prob=0.5), True)


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
    check(batch, with_score=True)


def compiled_variants(kernel) -> int:
    fn = kernel
    while not hasattr(fn, "device_caches"):  # the autotuner holds the JITFunction in .fn
        fn = fn.fn
    return sum(len(entry[0]) for entry in fn.device_caches.values())


@needs_gpu
def test_plan_sizes_do_not_recompile():
    from flash_dllm.kernels._scheduled_attention_triton import _scheduled_attention_kernel

    counts = []
    for q_lens, kv_lens in (([128, 64], [1000, 2000]), ([4, 300, 128], [77, 4000, 129]), ([1], [5])):
        Batch(q_lens, kv_lens, 28, 4, 128, torch.bfloat16, block_m=64, in_query=True).run("triton")
        counts.append(compiled_variants(_scheduled_attention_kernel))
    assert counts[0] >= 1 and counts[1:] == counts[:1] * 2, counts
