"""Fused residual-add + RMSNorm and SwiGLU activation kernels vs the unfused torch expressions they replace.

Runs the Triton kernels through the CPU interpreter (TRITON_INTERPRET=1) at small odd shapes, or with
TRITON_INTERPRET=0 on a CUDA machine, where the full LLaDA-8B / Dream-7B shapes and a CUDA-graph replay run too.

What "exact" means here (see the op modules' contracts):
  * new_residual and silu_mul on CUDA: bit for bit.
  * normed: bit for bit *given the row's fp32 factor r = rsqrt(mean(x^2) + eps)*. The kernel and torch sum
    the squares in different orders, so each row's r may sit a few fp32 ulps from torch's. Each row must equal
    ((x * r') * w).to(dtype) exactly for some r' within FACTOR_ULPS of torch's r, so an error anywhere else
    (operation order, a second rounding, a wrong element) fails. Most rows must reproduce torch's own r.
  * silu_mul in the interpreter: torch's CPU exp (SLEEF) and numpy's differ by an ulp, so every element must
    equal the torch expression with silu's fp32 value moved by at most SILU_ULPS, and nearly all exactly.
"""
from kernel_testing import DEVICE, needs_gpu, needs_triton  # noqa: F401  (sets TRITON_INTERPRET first)
from kernel_testing import bits_equal as same_bits, check_silu_mul, nudged, ulp_order  # noqa: E402

import itertools  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from flash_dllm.kernels.add_rms_norm import (AddRMSNorm, add_rms_norm, add_rms_norm_reference,  # noqa: E402
                                             rms_norm_reference)
from flash_dllm.kernels.silu_mul import SiluMul, silu_mul, silu_mul_reference  # noqa: E402

pytestmark = needs_triton

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
EPS = 1e-5
FACTOR_ULPS = 4  # two differently ordered fp32 sums, then sqrt and 1/x each round: r moves ~2 ulps at most
MODELS = {"llada-8b": (4096, 12288), "dream-7b": (3584, 18944)}  # d_model, MLP width F


def factor_ulps_per_row(new_residual, weight, eps, normed) -> torch.Tensor:
    """For each row, the smallest |k| such that normed == ((x * r_k) * w).to(dtype) with r_k torch's row
    factor moved k ulps; -1 where no k up to FACTOR_ULPS reproduces the row."""
    x = new_residual.float()
    r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    found = torch.full((x.shape[0],), -1, dtype=torch.int64, device=x.device)
    for k in ulp_order(FACTOR_ULPS):
        candidate = ((x * nudged(r, k)) * weight.float()).to(normed.dtype)
        hit = same_bits(candidate, normed).all(dim=1) & (found < 0)
        found[hit] = abs(k)
    return found


def check_normed(new_residual, weight, normed, eps=EPS, majority=True):
    ulps = factor_ulps_per_row(new_residual, weight, eps, normed)
    assert (ulps >= 0).all(), f"rows not reproducible from any nearby row factor: {(ulps < 0).nonzero().flatten()[:8]}"
    if majority:
        assert (ulps == 0).float().mean() >= 0.5, "most rows should reproduce torch's own row factor"


def norm_inputs(n, d, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    residual = (torch.randn(n, d, generator=gen) * 4).to(DEVICE, dtype)
    update = torch.randn(n, d, generator=gen).to(DEVICE, dtype)
    weight = (torch.rand(d, generator=gen) + 0.5).to(DEVICE, dtype)
    return residual, update, weight


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n,d", list(itertools.product([1, 3, 17, 130], [64, 96, 200, 3584, 4096])))
def test_add_rms_norm_matches_unfused_torch(n, d, dtype):
    residual, update, weight = norm_inputs(n, d, dtype, seed=n * 10007 + d)
    new_residual, normed = add_rms_norm(residual, update, weight, EPS, backend="triton")
    assert normed.shape == (n, d) and normed.dtype == dtype
    assert same_bits(new_residual, residual + update).all()
    check_normed(residual + update, weight, normed, majority=n == 130)


def integer_norm_inputs(n, d, dtype, seed=0):
    """Integers in [-16, 16]: every partial sum of the squares is exact in fp32 (< 2^24), so the summation
    order cannot matter and the whole op must be bit-exact (mean, eps, rsqrt, products, roundings)."""
    gen = torch.Generator().manual_seed(seed)
    residual = torch.randint(-16, 17, (n, d), generator=gen).to(DEVICE, dtype)
    update = torch.randint(-16, 17, (n, d), generator=gen).to(DEVICE, dtype)
    weight = (torch.rand(d, generator=gen) + 0.5).to(DEVICE, dtype)
    return residual, update, weight


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("d", [96, 200, 3584, 4096])
def test_add_rms_norm_bit_exact_when_the_sum_of_squares_is_exact(d, dtype):
    residual, update, weight = integer_norm_inputs(130, d, dtype, seed=d)
    new_residual, normed = add_rms_norm(residual, update, weight, EPS, backend="triton")
    assert same_bits(new_residual, residual + update).all()
    assert same_bits(normed, rms_norm_reference(residual + update, weight, EPS)).all()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_add_rms_norm_in_place_into_strided_buffers(dtype):
    """The engine's use: h updated in place inside a wider buffer, normed into a preallocated strided out."""
    n, d = 17, 200
    residual, update, weight = norm_inputs(n, d, dtype, seed=1)
    expected_residual = residual + update
    h_buffer = torch.full((n, d + 24), float("nan"), device=DEVICE, dtype=dtype)
    h = h_buffer[:, 8 : 8 + d]
    h.copy_(residual)
    out_buffer = torch.full((n, d + 8), float("nan"), device=DEVICE, dtype=dtype)
    out = out_buffer[:, :d]
    new_residual, normed = add_rms_norm(h, update, weight, EPS, out=out, inplace=True, backend="triton")
    assert new_residual.data_ptr() == h.data_ptr() and normed.data_ptr() == out.data_ptr()
    assert same_bits(h, expected_residual).all()
    check_normed(expected_residual, weight, out, majority=False)
    assert h_buffer[:, :8].isnan().all() and h_buffer[:, 8 + d :].isnan().all(), "wrote outside h"
    assert out_buffer[:, d:].isnan().all(), "wrote outside out"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n,d", [(1, 64), (17, 96), (130, 4096)])
def test_plain_rms_norm_when_update_is_none(n, d, dtype):
    residual, _, weight = norm_inputs(n, d, dtype, seed=2)
    before = residual.clone()
    new_residual, normed = add_rms_norm(residual, None, weight, EPS, backend="triton")
    assert new_residual is residual and same_bits(residual, before).all()
    check_normed(residual, weight, normed, majority=n == 130)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n,d,picked", [(17, 96, [16, 0, 3, 3, 9]), (130, 4096, list(range(129, 1, -8))),
                                        (5, 200, [2]), (3, 64, [])])
@pytest.mark.parametrize("with_update", [True, False], ids=["add", "plain"])
def test_gathered_rows_equal_the_norm_of_the_selected_rows(n, d, picked, with_update, dtype):
    """rows= (the engine's final norm over the rows the LM head reads): out of order, repeated, one, none. The
    kernel against the reference over the same gathered rows, bit for bit where the squares sum exactly."""
    residual, update, weight = integer_norm_inputs(n, d, dtype, seed=n + d)
    update = update if with_update else None
    rows = torch.tensor(picked, dtype=torch.int64, device=DEVICE)
    before = residual.clone()
    new_residual, normed = add_rms_norm(residual, update, weight, EPS, rows=rows, backend="triton")
    gathered = residual[rows] + update[rows] if with_update else residual[rows]
    assert new_residual.shape == normed.shape == (len(picked), d)
    assert same_bits(new_residual, gathered).all() and same_bits(residual, before).all()
    assert same_bits(normed, rms_norm_reference(gathered, weight, EPS)).all()
    ref_residual, ref_normed = add_rms_norm_reference(residual, update, weight, EPS, rows=rows)
    assert same_bits(ref_residual, new_residual).all() and same_bits(ref_normed, normed).all()
    out = torch.full((len(picked), d), float("nan"), device=DEVICE, dtype=dtype)
    _, into = add_rms_norm(residual, update, weight, EPS, rows=rows, out=out, backend="triton")
    assert into.data_ptr() == out.data_ptr() and same_bits(out, normed).all()


def test_gathered_rows_are_checked():
    residual, update, weight = norm_inputs(4, 64, torch.bfloat16)
    for rows, match in [(torch.tensor([0, 4], device=DEVICE), "index"), (torch.tensor([-1], device=DEVICE), "index"),
                        (torch.tensor([0], dtype=torch.int32, device=DEVICE), "int64"),
                        (torch.tensor([[0]], device=DEVICE), "1-D")]:
        with pytest.raises(ValueError, match=match):
            add_rms_norm(residual, update, weight, EPS, rows=rows, backend="triton")
    with pytest.raises(ValueError, match="inplace"):
        add_rms_norm(residual, update, weight, EPS, rows=torch.tensor([0], device=DEVICE), inplace=True)
    with pytest.raises(ValueError, match="out must be"):
        add_rms_norm(residual, update, weight, EPS, rows=torch.tensor([0], device=DEVICE),
                     out=torch.empty_like(residual))


def test_norm_reference_is_the_engine_formula():
    """The reference reproduces engine/model.py's CPU rms_norm bit for bit, and the add is `residual + update`."""
    engine_rms_norm = pytest.importorskip("flash_dllm.engine.model").rms_norm  # absent where only kernels/ ships
    residual, update, weight = norm_inputs(33, 3584, torch.bfloat16, seed=3)
    residual, update, weight = residual.cpu(), update.cpu(), weight.cpu()
    new_residual, normed = add_rms_norm_reference(residual, update, weight, EPS)
    assert same_bits(new_residual, residual + update).all()
    assert same_bits(normed, engine_rms_norm(residual + update, weight, EPS)).all()
    assert same_bits(rms_norm_reference(residual, weight, EPS), engine_rms_norm(residual, weight, EPS)).all()


def gate_up_inputs(n, f, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(n, 2 * f, generator=gen) * 3).to(DEVICE, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n,f", list(itertools.product([1, 3, 17, 130], [64, 96, 200, 1000])))
def test_silu_mul_matches_torch_expression(n, f, dtype):
    gate_up = gate_up_inputs(n, f, dtype, seed=n * 10007 + f)
    act = silu_mul(gate_up, backend="triton")
    assert act.shape == (n, f) and act.dtype == dtype
    check_silu_mul(gate_up, act, min_exact=0.9 if dtype == torch.float32 else 0.999)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning", "ignore:invalid value:RuntimeWarning")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_silu_mul_special_values(dtype):
    """Overflowing exp (silu -> -0), infinities, NaN, zeros of both signs, values near silu's rounding range."""
    specials = torch.tensor([-200.0, -89.0, -88.0, -20.0, -1e-3, -0.0, 0.0, 1e-3, 20.0, 88.0, 89.0, 200.0,
                             float("inf"), float("-inf"), float("nan"), 1.0])
    gate = specials.repeat(4).reshape(4, -1)
    up = torch.tensor([1.0, -2.0, 0.5, 3.0])[:, None].expand_as(gate)
    gate_up = torch.cat([gate, up], dim=1).to(DEVICE, dtype)
    act = silu_mul(gate_up, backend="triton")
    assert same_bits(act, silu_mul_reference(gate_up)).all()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_silu_mul_strided_input_into_out_buffer(dtype):
    n, f = 17, 200
    wide = gate_up_inputs(n, f + 40, dtype, seed=4)
    gate_up = wide[:, 10 : 10 + 2 * f]  # row stride 2F + 80
    out_buffer = torch.full((n, f + 16), float("nan"), device=DEVICE, dtype=dtype)
    out = out_buffer[:, :f]
    act = silu_mul(gate_up, out=out, backend="triton")
    assert act.data_ptr() == out.data_ptr() and out_buffer[:, f:].isnan().all()
    check_silu_mul(gate_up, out, min_exact=0.9 if dtype == torch.float32 else 0.999)


def test_bound_ops_run_the_same_code_as_the_dispatchers():
    residual, update, weight = norm_inputs(17, 96, torch.bfloat16, seed=5)
    gate_up = gate_up_inputs(17, 96, torch.bfloat16, seed=5)
    for backend in ("torch", "triton"):
        nr_bound, normed_bound = AddRMSNorm(backend)(residual, update, weight, EPS)
        nr_free, normed_free = add_rms_norm(residual, update, weight, EPS, backend=backend)
        assert same_bits(nr_bound, nr_free).all() and same_bits(normed_bound, normed_free).all()
        assert same_bits(SiluMul(backend)(gate_up), silu_mul(gate_up, backend=backend)).all()
    with pytest.raises(ValueError, match="unknown kernel backend"):
        AddRMSNorm("cuda")
    with pytest.raises(ValueError, match="unknown kernel backend"):
        SiluMul("cuda")


def test_dispatchers_reject_contract_violations():
    residual, update, weight = norm_inputs(4, 64, torch.bfloat16)
    bad_norm_calls = [
        dict(residual=residual, update=update.float(), weight=weight),  # mixed dtypes would promote in torch
        dict(residual=residual, update=update[:3], weight=weight),
        dict(residual=residual, update=update, weight=weight[:32]),
        dict(residual=residual.t(), update=None, weight=weight[:4]),  # last dimension not contiguous
        dict(residual=residual, update=update, weight=weight, out=torch.empty_like(residual, dtype=torch.float32)),
        dict(residual=residual[None], update=None, weight=weight),
    ]
    for call in bad_norm_calls:
        with pytest.raises(ValueError):
            add_rms_norm(eps=EPS, backend="triton", **call)
    with pytest.raises(ValueError, match="8192"):
        wide = torch.zeros(1, 8200, device=DEVICE)
        add_rms_norm(wide, None, torch.ones(8200, device=DEVICE), EPS, backend="triton")
    gate_up = gate_up_inputs(4, 64, torch.bfloat16)
    bad_silu_calls = [(gate_up[:, :127], None), (gate_up.int(), None), (gate_up, torch.empty(4, 65, device=DEVICE))]
    for bad_gate_up, out in bad_silu_calls:
        with pytest.raises(ValueError):
            silu_mul(bad_gate_up, out=out, backend="triton")


@needs_gpu
@pytest.mark.parametrize("n", [128, 4096])
@pytest.mark.parametrize("model", list(MODELS))
def test_full_shapes_match_torch_on_cuda(model, n):
    d, f = MODELS[model]
    residual, update, weight = norm_inputs(n, d, torch.bfloat16, seed=6)
    new_residual, normed = add_rms_norm(residual, update, weight, EPS, backend="triton")
    assert same_bits(new_residual, residual + update).all()
    check_normed(residual + update, weight, normed)
    _, plain = add_rms_norm(residual, None, weight, EPS, backend="triton")
    check_normed(residual, weight, plain)
    residual, update, weight = integer_norm_inputs(n, d, torch.bfloat16, seed=6)
    _, normed = add_rms_norm(residual, update, weight, EPS, backend="triton")
    assert same_bits(normed, rms_norm_reference(residual + update, weight, EPS)).all()
    for dtype in DTYPES:
        gate_up = gate_up_inputs(n, f, dtype, seed=7)
        act = silu_mul(gate_up, backend="triton")
        mismatched = ~same_bits(act, silu_mul_reference(gate_up))
        assert not mismatched.any(), f"{dtype}: {mismatched.sum().item()} of {act.numel()} outputs differ"


@needs_gpu
def test_cuda_graph_replay_equals_eager_launches():
    """Two layers' worth of the decode step's small ops captured once, replayed on fresh inputs."""
    d, f = MODELS["dream-7b"]
    n, layers, dtype = 128, 2, torch.bfloat16
    norm, act_fn = AddRMSNorm("triton"), SiluMul("triton")
    h, update, weight = norm_inputs(n, d, dtype, seed=8)
    gate_up = gate_up_inputs(n, f, dtype, seed=8)
    normed, act = torch.empty_like(h), torch.empty(n, f, device=DEVICE, dtype=dtype)

    def step():
        for _ in range(layers):
            norm(h, update, weight, EPS, out=normed, inplace=True)
            act_fn(gate_up, out=act)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # compiles and loads both kernels outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()

    fresh_h, fresh_update, _ = norm_inputs(n, d, dtype, seed=9)
    fresh_gate_up = gate_up_inputs(n, f, dtype, seed=9)
    h.copy_(fresh_h)
    update.copy_(fresh_update)
    gate_up.copy_(fresh_gate_up)
    graph.replay()
    torch.cuda.synchronize()
    eager_h = fresh_h.clone()
    for _ in range(layers):
        _, eager_normed = norm(eager_h, fresh_update, weight, EPS, inplace=True)
    assert same_bits(h, eager_h).all() and same_bits(normed, eager_normed).all()
    assert same_bits(act, act_fn(fresh_gate_up)).all()
