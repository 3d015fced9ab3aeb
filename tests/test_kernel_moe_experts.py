"""MoEExperts (routed SwiGLU experts, weighted sum per token) vs its torch reference.

Runs the Triton path through the CPU interpreter (TRITON_INTERPRET=1) at small odd shapes: widths that are not
multiples of any block, experts without tokens, experts whose rows span many M tiles, routing weights that sum
to one and that do not. With TRITON_INTERPRET=0 on a CUDA machine the LLaDA-MoE-7B-A1B and LLaDA2.0-mini
shapes run too, eagerly and replayed from a captured CUDA graph.

What is checked (see moe_experts.py for the rounding contract):
  * fp32: within 1e-5 of the reference (both accumulate in fp32; only the summation order differs);
  * bf16/fp16: within the dtype's tolerance of the reference, and at least as close as the reference to an
    fp64 evaluation of the same (rounded) inputs: the kernel rounds less, so it must not be further away;
  * bit-level facts that need no tolerance: unused experts' weights never reach the output, the result does
    not depend on the id/weight dtype when the values agree, and repeated calls give the same bits;
  * the device-side tile schedule against plain arithmetic, and the grid bound over every split of the rows.
"""
from kernel_testing import (DEVICE, TOL, compile_failures, compile_in_subprocesses, compiling_for_gpu,  # noqa: F401
                            needs_gpu, needs_triton, rel_err)  # (kernel_testing sets TRITON_INTERPRET first)

import functools  # noqa: E402
import itertools  # noqa: E402
import math  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from flash_dllm.kernels.moe_experts import MoEExperts, check_moe_experts_inputs, moe_experts_reference  # noqa: E402

pytestmark = needs_triton

MODELS = {  # experts, top-k, d_model, expert hidden F (config.json of each model)
    "llada-moe-7b-a1b": (64, 8, 2048, 1024),
    "llada2.0-mini": (256, 8, 2048, 512),
}
# 16-row M tiles and narrow column blocks: many tiles per expert, a tail in every dimension of the odd shapes
SMALL_TILES = dict(block_m=16, block_f=32, block_d=64, block_k=64, warps=4, stages=2)
WEIGHT_KINDS = ("softmax", "scaled")  # sums to one per token / sigmoid-like scores times 2.5, as LLaDA2 routes


def small_tiles():
    from flash_dllm.kernels._moe_experts_triton import MoETiles

    return MoETiles(**SMALL_TILES)


def expert_weights(n_experts, d_model, ffn, dtype, seed=0):
    gen = torch.Generator(DEVICE).manual_seed(seed)  # on the device: the model shapes are gigabytes
    w_gate_up = torch.randn(n_experts, 2 * ffn, d_model, generator=gen, device=DEVICE) / d_model**0.5
    w_down = torch.randn(n_experts, d_model, ffn, generator=gen, device=DEVICE) / ffn**0.5
    return w_gate_up.to(dtype), w_down.to(dtype)


def routing(n_tokens, n_experts, top_k, kind="softmax", seed=1, hot=None):
    """Distinct expert ids per token (random, or all tokens on the experts `hot`) and their weights."""
    gen = torch.Generator().manual_seed(seed)
    if hot is None:
        ids = torch.rand(n_tokens, n_experts, generator=gen).argsort(dim=1)[:, :top_k]
    else:
        ids = torch.tensor(hot).repeat(n_tokens, 1)
    scores = torch.randn(n_tokens, top_k, generator=gen)
    weights = scores.softmax(dim=1) if kind == "softmax" else torch.sigmoid(scores) * 2.5
    return ids.to(DEVICE), weights.to(DEVICE)


def hidden(n_tokens, d_model, dtype, seed=2):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n_tokens, d_model, generator=gen).to(DEVICE, dtype)


def check_close(x, ids, weights, w_gate_up, w_down, out):
    """Within the dtype's tolerance of the reference; for 16-bit inputs also no further than the reference
    from the fp64 evaluation of the same inputs (the kernel rounds less than the reference does)."""
    expected = moe_experts_reference(x, ids, weights, w_gate_up, w_down)
    assert out.shape == expected.shape and out.dtype == x.dtype
    err = rel_err(out, expected)
    assert err <= TOL[x.dtype], f"kernel vs reference: {err:.2e}"
    if x.dtype != torch.float32:
        exact = moe_experts_reference(x.double(), ids, weights.double(), w_gate_up.double(), w_down.double())
        kernel_err, reference_err = rel_err(out, exact), rel_err(expected, exact)
        assert kernel_err <= 1.1 * reference_err, f"kernel {kernel_err:.2e} vs fp64, reference {reference_err:.2e}"


# T, E, K, D, F: every width off the block sizes; T=1 with E=64 leaves most experts empty; (17, 7, 7) puts 17
# rows on every expert, which needs exactly max_m_tiles 16-row tiles (two per expert, the second with 1 row).
CASES = [(1, 4, 1, 72, 40), (3, 4, 2, 72, 40), (17, 7, 2, 200, 96), (17, 7, 7, 72, 40), (1, 64, 8, 200, 96),
         (3, 64, 8, 72, 40), (17, 64, 1, 72, 40), (130, 4, 2, 72, 40), (130, 7, 2, 200, 40)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("n_tokens,n_experts,top_k,d_model,ffn", CASES)
@pytest.mark.parametrize("tiles", ["default", "small"])
def test_matches_reference(n_tokens, n_experts, top_k, d_model, ffn, dtype, tiles):
    kind = WEIGHT_KINDS[(n_tokens + top_k + (tiles == "small")) % 2]  # each case meets both kinds of weights
    w_gate_up, w_down = expert_weights(n_experts, d_model, ffn, dtype, seed=n_experts)
    ids, weights = routing(n_tokens, n_experts, top_k, kind, seed=n_tokens * 31 + top_k)
    x = hidden(n_tokens, d_model, dtype, seed=d_model)
    op = MoEExperts("triton", DEVICE, check_inputs=True, tiles=small_tiles() if tiles == "small" else None)
    check_close(x, ids, weights, w_gate_up, w_down, op(x, ids, weights, w_gate_up, w_down))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_many_tokens_over_64_experts(dtype):
    """130 tokens x top-8 over 64 experts: ~16 rows per expert, so 1-2 tiles each and some experts empty."""
    w_gate_up, w_down = expert_weights(64, 200, 96, dtype, seed=3)
    ids, weights = routing(130, 64, 8, "scaled", seed=4)
    x = hidden(130, 200, dtype, seed=5)
    check_close(x, ids, weights, w_gate_up, w_down, MoEExperts("triton", DEVICE)(x, ids, weights, w_gate_up, w_down))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_hot_experts_span_many_tiles(dtype):
    """Every token on the same two of 7 experts: 130 rows each, nine 16-row tiles per expert, five experts idle."""
    w_gate_up, w_down = expert_weights(7, 72, 40, dtype, seed=6)
    ids, weights = routing(130, 7, 2, "scaled", seed=7, hot=[5, 2])
    x = hidden(130, 72, dtype, seed=8)
    op = MoEExperts("triton", DEVICE, tiles=small_tiles())
    check_close(x, ids, weights, w_gate_up, w_down, op(x, ids, weights, w_gate_up, w_down))


def test_unused_experts_are_never_read():
    """Experts no token names may hold anything (NaN here): the output keeps the same bits."""
    w_gate_up, w_down = expert_weights(64, 72, 40, torch.bfloat16, seed=9)
    ids, weights = routing(3, 64, 2, seed=10)
    x = hidden(3, 72, torch.bfloat16)
    op = MoEExperts("triton", DEVICE)
    clean = op(x, ids, weights, w_gate_up, w_down)
    unused = torch.ones(64, dtype=torch.bool, device=DEVICE)
    unused[ids.flatten()] = False
    w_gate_up[unused], w_down[unused] = float("nan"), float("nan")
    poisoned = op(x, ids, weights, w_gate_up, w_down)
    assert torch.equal(clean.view(torch.int16), poisoned.view(torch.int16))
    check_close(x, ids, weights, w_gate_up, w_down, poisoned)


def test_same_bits_whatever_the_id_and_weight_dtypes():
    """int32 vs int64 ids and fp32 vs bf16 weights (bf16-exact values): one schedule, one sum, the same bits;
    and a second call repeats the first exactly."""
    w_gate_up, w_down = expert_weights(7, 72, 40, torch.bfloat16, seed=11)
    ids, weights = routing(17, 7, 2, "scaled", seed=12)
    weights = weights.to(torch.bfloat16)
    x = hidden(17, 72, torch.bfloat16)
    op = MoEExperts("triton", DEVICE)
    first = op(x, ids.long(), weights.float(), w_gate_up, w_down)
    for call_ids, call_weights in ((ids.int(), weights), (ids.int(), weights.float()), (ids.long(), weights.float())):
        again = op(x, call_ids, call_weights, w_gate_up, w_down)
        assert torch.equal(first.view(torch.int16), again.view(torch.int16))


def test_an_expert_named_twice_counts_twice():
    w_gate_up, w_down = expert_weights(4, 72, 40, torch.float32, seed=13)
    x = hidden(3, 72, torch.float32)
    ids = torch.tensor([[1, 1], [0, 3], [2, 2]], device=DEVICE)
    weights = torch.tensor([[0.25, 0.5], [0.6, 0.4], [1.0, -2.0]], device=DEVICE)
    out = MoEExperts("triton", DEVICE)(x, ids, weights, w_gate_up, w_down)
    merged = MoEExperts("triton", DEVICE)(x, ids[:, :1], weights.sum(dim=1, keepdim=True), w_gate_up, w_down)
    twice = torch.tensor([0, 2], device=DEVICE)  # the tokens that name one expert in both slots
    assert rel_err(out[twice], merged[twice]) <= TOL[torch.float32]
    check_close(x, ids, weights, w_gate_up, w_down, out)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_out_buffer_strided_input_and_no_tokens(backend):
    w_gate_up, w_down = expert_weights(7, 72, 40, torch.bfloat16, seed=14)
    ids, weights = routing(17, 7, 2, seed=15)
    wide = hidden(17, 100, torch.bfloat16)
    x = wide[:, 8:80]  # row stride 100
    out_buffer = torch.full((17, 90), float("nan"), device=DEVICE, dtype=torch.bfloat16)
    out = out_buffer[:, 4:76]
    op = MoEExperts(backend, DEVICE, check_inputs=True)
    result = op(x, ids, weights, w_gate_up, w_down, out=out)
    assert result.data_ptr() == out.data_ptr()
    assert out_buffer[:, :4].isnan().all() and out_buffer[:, 76:].isnan().all(), "wrote outside out"
    check_close(x, ids, weights, w_gate_up, w_down, out)
    empty = op(x[:0], ids[:0], weights[:0], w_gate_up, w_down)
    assert empty.shape == (0, 72) and empty.dtype == torch.bfloat16


def test_backends_resolve_at_construction():
    assert MoEExperts("auto", "cpu").backend == "torch" and MoEExperts(None, "cpu").backend == "torch"
    assert MoEExperts("triton", DEVICE).backend == "triton"  # the interpreter, or CUDA
    with pytest.raises(ValueError, match="unknown kernel path"):
        MoEExperts("cuda", "cpu")
    w_gate_up, w_down = expert_weights(4, 72, 40, torch.bfloat16, seed=16)
    ids, weights = routing(3, 4, 2, seed=17)
    x = hidden(3, 72, torch.bfloat16)
    reference = moe_experts_reference(x, ids, weights, w_gate_up, w_down)
    assert torch.equal(MoEExperts("torch", DEVICE)(x, ids, weights, w_gate_up, w_down), reference)


def test_contract_violations_are_refused():
    w_gate_up, w_down = expert_weights(4, 72, 40, torch.bfloat16, seed=18)
    ids, weights = routing(3, 4, 2, seed=19)
    x = hidden(3, 72, torch.bfloat16)
    good = dict(x=x, topk_ids=ids, topk_weights=weights, w_gate_up=w_gate_up, w_down=w_down)
    bad_calls = [
        dict(topk_ids=ids.float()),  # float ids
        dict(topk_ids=ids[:2]),  # one id row short
        dict(topk_weights=weights.int()),
        dict(topk_weights=weights[:, :1]),
        dict(topk_weights=weights.half()),  # neither fp32 nor x's dtype
        dict(w_gate_up=w_gate_up[:, :79]),  # odd 2F
        dict(w_down=w_down[:, :, :39]),  # F differs from w_gate_up's
        dict(w_down=w_down.float()),  # weights in another dtype than x
        dict(x=x.t().contiguous().t()),  # last dimension not contiguous
        dict(w_gate_up=w_gate_up[:3], w_down=w_down[:3], topk_ids=torch.tensor([[0, 1, 2, 0]] * 3, device=DEVICE),
             topk_weights=torch.ones(3, 4, device=DEVICE)),  # top-4 of 3 experts
        dict(topk_ids=ids + 4),  # ids past the last expert (a value check: check_inputs only)
        dict(topk_ids=ids - 4),
    ]
    for change in bad_calls:
        call = {**good, **change}
        with pytest.raises(ValueError):
            check_moe_experts_inputs(**call, check_values=True)
        with pytest.raises(ValueError):
            MoEExperts("triton", DEVICE, check_inputs=True)(**call)
    with pytest.raises(ValueError, match="out must be"):
        check_moe_experts_inputs(**good, out=torch.empty(3, 72, device=DEVICE))
    check_moe_experts_inputs(**good, check_values=True)  # the good call itself passes


# ---- the schedule: plain arithmetic ----------------------------------------------------------------------------

def test_max_m_tiles_bounds_every_split_of_the_rows():
    """No split of the pairs among the experts needs more M tiles than the grid has."""
    from flash_dllm.kernels._moe_experts_triton import max_m_tiles

    for n_experts, n_pairs, block_m in itertools.product(range(1, 5), range(1, 13), range(1, 6)):
        worst = max(sum(math.ceil(c / block_m) for c in counts)
                    for counts in itertools.product(range(n_pairs + 1), repeat=n_experts) if sum(counts) == n_pairs)
        assert worst <= max_m_tiles(n_pairs, n_experts, block_m), (n_experts, n_pairs, block_m)
    assert max_m_tiles(119, 7, 16) == 14  # CASES' (17, 7, 7): 7 experts x cdiv(17, 16) tiles, the bound is tight


@pytest.mark.parametrize("id_dtype", [torch.int32, torch.int64], ids=str)
@pytest.mark.parametrize("counts", [[0, 0, 5, 0], [16, 17, 0, 1, 33, 0, 0], [3] * 64, [0] * 63 + [40], [1]])
def test_device_schedule_is_the_plain_tile_arithmetic(counts, id_dtype):
    """From expert-sorted ids the schedule kernel finds each expert's rows and numbers the M tiles expert by
    expert, cdiv(count, block_m) each, the last one partial; the rest of the grid is marked past the end."""
    from flash_dllm.kernels._moe_experts_triton import moe_launch, tile_schedule

    block_m = small_tiles().block_m
    n_experts, n_pairs = len(counts), sum(counts)
    top_k = 1 if n_pairs % 2 else 2
    launch = moe_launch(n_pairs // top_k, top_k, n_experts, 64, 64, torch.float32, small_tiles())
    sorted_ids = torch.repeat_interleave(torch.arange(n_experts), torch.tensor(counts)).to(DEVICE, id_dtype)
    schedule = tile_schedule(sorted_ids, launch, n_experts).cpu().tolist()
    starts = [0, *itertools.accumulate(counts)]
    expected = [(e, starts[e] + i * block_m, starts[e + 1]) for e, count in enumerate(counts)
                for i in range(math.ceil(count / block_m))]
    expected += [(n_experts, None, None)] * (launch.m_tiles - len(expected))
    assert len(expected) == launch.m_tiles
    for tile, (expert, row0, row_end) in enumerate(expected):
        assert schedule[0][tile] == expert, tile
        if row0 is not None:
            assert (schedule[1][tile], schedule[2][tile]) == (row0, row_end), tile


# ---- compiled for real GPUs, without one ----------------------------------------------------------------------

def compile_for_gpu(capability: int):
    """The routed experts at the model shapes, compiled for an sm_<capability> GPU with the launch constants
    moe_experts_triton picks (kernel_testing.compiling_for_gpu; run with TRITON_INTERPRET=0): the CompileLog."""
    from flash_dllm.kernels._moe_experts_triton import moe_experts_triton

    def meta(*shape, dtype=torch.bfloat16):
        return torch.empty(*shape, dtype=dtype, device="meta")

    with compiling_for_gpu(capability) as log:
        for model, (n_experts, top_k, d_model, ffn) in MODELS.items():
            for n_tokens in (32, 2048):
                log.choice = f"moe {model} {n_tokens} tokens"
                moe_experts_triton(meta(n_tokens, d_model), meta(n_tokens, top_k, dtype=torch.int64),
                                   meta(n_tokens, top_k, dtype=torch.float32), meta(n_experts, 2 * ffn, d_model),
                                   meta(n_experts, d_model, ffn))
    return log


@functools.lru_cache(maxsize=None)
def compiled_for_gpus() -> dict:
    pytest.importorskip("triton.backends.nvidia")
    return compile_in_subprocesses("test_kernel_moe_experts", "compile_for_gpu", (90, 86))


@pytest.mark.skipif(DEVICE == "cuda", reason="the GPU tests compile and run the kernels themselves")
@pytest.mark.parametrize("capability", [90, 86])  # H200; RTX 3090 (100 KB of shared memory per block)
def test_kernels_compile_for_gpus(capability):
    """The interpreter runs the kernels as Python; this compiles them as a GPU would (through ptxas), so an
    error only the compiler sees (types, layouts, shared memory) fails here rather than on the GPU machine."""
    kernels = compiled_for_gpus()[capability]
    failures = compile_failures(kernels, capability)
    assert not failures, "\n".join(failures)
    assert len(kernels) == 16, kernels  # 2 models x 2 token counts x 4 kernels


# ---- CUDA: model shapes and graph replay -----------------------------------------------------------------------

@needs_gpu
@pytest.mark.parametrize("n_tokens", [1, 32, 128, 2048])
@pytest.mark.parametrize("model", list(MODELS))
def test_model_shapes_on_cuda(model, n_tokens):
    n_experts, top_k, d_model, ffn = MODELS[model]
    w_gate_up, w_down = expert_weights(n_experts, d_model, ffn, torch.bfloat16, seed=20)
    ids, weights = routing(n_tokens, n_experts, top_k, "scaled", seed=n_tokens)
    x = hidden(n_tokens, d_model, torch.bfloat16, seed=21)
    op = MoEExperts("triton", DEVICE)
    out = op(x, ids, weights, w_gate_up, w_down)
    err = rel_err(out, moe_experts_reference(x, ids, weights, w_gate_up, w_down))
    assert err <= TOL[torch.bfloat16], err
    assert torch.equal(out.view(torch.int16), op(x, ids.int(), weights, w_gate_up, w_down).view(torch.int16))


@needs_gpu
@pytest.mark.parametrize("n_tokens", [32, 256])
@pytest.mark.parametrize("model", list(MODELS))
def test_cuda_graph_replay_with_new_routing(model, n_tokens):
    """Captured once on static buffers; new hidden states, ids and weights copied in give the new answer."""
    n_experts, top_k, d_model, ffn = MODELS[model]
    w_gate_up, w_down = expert_weights(n_experts, d_model, ffn, torch.bfloat16, seed=22)
    x = hidden(n_tokens, d_model, torch.bfloat16, seed=23)
    ids, weights = routing(n_tokens, n_experts, top_k, "softmax", seed=24)
    out = torch.empty_like(x)
    op = MoEExperts("triton", DEVICE)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        op(x, ids, weights, w_gate_up, w_down, out=out)  # compiles every kernel outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        op(x, ids, weights, w_gate_up, w_down, out=out)

    for seed, hot in ((25, None), (26, list(range(top_k)))):  # fresh random routing, then every token on K experts
        new_x = hidden(n_tokens, d_model, torch.bfloat16, seed=seed)
        new_ids, new_weights = routing(n_tokens, n_experts, top_k, "scaled", seed=seed, hot=hot)
        x.copy_(new_x)
        ids.copy_(new_ids)
        weights.copy_(new_weights)
        graph.replay()
        torch.cuda.synchronize()
        eager = op(new_x, new_ids, new_weights, w_gate_up, w_down)
        assert torch.equal(out.view(torch.int16), eager.view(torch.int16))
        err = rel_err(out, moe_experts_reference(new_x, new_ids, new_weights, w_gate_up, w_down))
        assert err <= TOL[torch.bfloat16], err
