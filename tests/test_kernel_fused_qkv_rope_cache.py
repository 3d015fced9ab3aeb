"""Fused QKV + RoPE + cache-write kernels vs the plain-PyTorch reference, and the op that binds them once.

Runs the Triton kernels through the CPU interpreter (TRITON_INTERPRET=1, small shapes) or, with
TRITON_INTERPRET=0 on a CUDA machine, on the GPU, where the full LLaDA-8B / Dream-7B layer shapes also run.

Tolerances (relative Frobenius-norm error vs the reference):
  fp32 1e-5 (fp32 accumulation on both sides, only the summation order differs);
  fp16 2e-3 and bf16 1e-2: the kernel rounds once after RoPE, the reference rounds the projection and
  again after RoPE, and the interpreter stores bf16 by truncation (measured ~4e-3 against the reference).
Cache rows that no token names must stay bit-identical.

Three kernels sit behind the Triton backend: the pointer kernel (any GPU, the interpreter's default) and the
TMA kernels (compute capability >= 9, head dim 128: a data-parallel grid and a stream-K schedule).
`forced_fused_qkv` forces a path and its candidate configs; the TMA tests force them under the interpreter too
(which runs tensor descriptors), once per config shape (WIDE one head, WIDE two heads, SPLIT half-head column
blocks; the stream-K-tail schedule with one- and two-head tiles over 7 "SMs": whole tail tiles, tiles split over
programs, ranges running from one tile into the next). The op tests check that a FusedQKVRopeCache binds once
(process-wide counters of the slow steps) and gives the functional dispatcher's bits; on a GPU, that its calls
replay from a CUDA graph.
"""
from kernel_testing import (DEVICE, MODELS, Layer, compare, needs_gpu, needs_triton, rel_err,  # noqa: F401
                            same_bits, tokens)  # (kernel_testing sets TRITON_INTERPRET first)

import subprocess  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from flash_dllm.kernels import gpu_time_ms  # noqa: E402
from flash_dllm.kernels import _fused_qkv_pointer as pointer_module  # noqa: E402
from flash_dllm.kernels import _fused_qkv_streamk as streamk_module  # noqa: E402
from flash_dllm.kernels import _fused_qkv_tma as tma_module  # noqa: E402
from flash_dllm.kernels._fused_qkv_common import tma_available  # noqa: E402
from flash_dllm.kernels.fused_qkv_rope_cache import (CHECK_ENV, KERNEL_PATHS, PATH_ENV, FusedQKVChoice,  # noqa: E402
                                                     FusedQKVRopeCache, current_fused_qkv_forcing, forced_fused_qkv,
                                                     fused_qkv_choice, fused_qkv_counters, fused_qkv_paths,
                                                     fused_qkv_problem_key, fused_qkv_rope_cache_reference,
                                                     read_path_request)

pytestmark = needs_triton
HOPPER = DEVICE == "cuda" and torch.cuda.get_device_capability()[0] >= 9
needs_tma = pytest.mark.skipif(not tma_available() or (DEVICE == "cuda" and not HOPPER),
                               reason="the TMA kernel needs tensor descriptors and (on CUDA) compute capability >= 9")
needs_hopper = pytest.mark.skipif(not HOPPER or not tma_available(),
                                  reason="TMA at full model shapes runs on a CUDA device of compute capability >= 9")
CAN_RUN_TMA = tma_available() and (DEVICE != "cuda" or HOPPER)
STREAMK_CUDA = {"one_head": streamk_module.StreamKConfig(64, 1, 32, 3, 4),
                "two_heads": streamk_module.StreamKConfig(128, 2, 32, 2, 8),
                "one_head_balanced": streamk_module.StreamKConfig(64, 1, 32, 3, 4, balanced=True)}


def forced(path: str, name: str):
    """Force one TMA path with one config shape (stream-K on a GPU: a CUDA config that fits fp32, untuned)."""
    if path == "tma":
        return forced_fused_qkv(path="tma", tma_configs=[tma_module.INTERPRETER_CONFIGS[name]])
    configs = STREAMK_CUDA if DEVICE == "cuda" else streamk_module.INTERPRETER_CONFIGS
    return forced_fused_qkv(path="streamk", streamk_configs=[configs[name]])


@pytest.mark.parametrize("n_tokens", [1, 3, 17, 129])
@pytest.mark.parametrize("n_heads,n_kv_heads,bias", [(4, 4, False), (4, 2, True)], ids=["mha", "gqa-bias"])
def test_matches_reference_fp32(n_heads, n_kv_heads, bias, n_tokens):
    layer = Layer(n_heads, n_kv_heads, head_dim=16, d_model=64, bias=bias, dtype=torch.float32)
    x, positions, cache_rows = tokens(n_tokens, 64, torch.float32, n_cache_rows=2 * n_tokens + 7)
    compare(layer, x, positions, cache_rows, 2 * n_tokens + 7)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_half_precisions(dtype):
    layer = Layer(4, 2, head_dim=32, d_model=96, bias=True, dtype=dtype, theta=1e6)
    x, positions, cache_rows = tokens(33, 96, dtype, n_cache_rows=80)
    compare(layer, x, positions, cache_rows, 80)


def test_ragged_batch_leaves_other_sequences_untouched():
    """A 1-token refresh beside a 300-token prefill; the cache is NaN-poisoned, a third slot stays NaN."""
    layer = Layer(4, 2, head_dim=16, d_model=64, bias=True, dtype=torch.float32)
    slot = 512
    positions = torch.cat([torch.tensor([700]), torch.arange(300)]).to(DEVICE)
    cache_rows = torch.cat([torch.tensor([0 * slot + 7]), 1 * slot + torch.arange(300)]).to(DEVICE)
    x = torch.randn(301, 64, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    compare(layer, x, positions, cache_rows, 3 * slot, fill=float("nan"))


def test_head_dim_128_gqa_bias():
    for dtype in (torch.float32, torch.bfloat16):
        layer = Layer(4, 1, head_dim=128, d_model=128, bias=True, dtype=dtype, theta=1e6)
        x, positions, cache_rows = tokens(5, 128, dtype, n_cache_rows=16)
        compare(layer, x, positions, cache_rows, 16)


def test_head_dim_not_a_power_of_two():
    """Pair tiles then straddle heads (Dh/2 = 12 does not divide the 64-pair tile)."""
    layer = Layer(3, 1, head_dim=24, d_model=48, bias=True, dtype=torch.float32)
    x, positions, cache_rows = tokens(19, 48, torch.float32, n_cache_rows=40)
    compare(layer, x, positions, cache_rows, 40)


def test_strided_inputs_and_int32_indices():
    """x as a column slice of a wider buffer, positions/cache rows as int32 (what a plan tensor holds)."""
    layer = Layer(4, 2, head_dim=16, d_model=64, bias=False, dtype=torch.float32)
    wide = torch.randn(21, 100, generator=torch.Generator().manual_seed(4)).to(DEVICE)
    x, positions, cache_rows = tokens(21, 64, torch.float32, n_cache_rows=50)
    compare(layer, wide[:, 10:74], positions.int(), cache_rows.int(), 50)


def test_rope_is_applied_to_q_and_k_only():
    """Position 0 is the identity rotation: moving every token there must change q and k but not v."""
    layer = Layer(2, 2, head_dim=16, d_model=32, bias=False, dtype=torch.float32)
    x, positions, cache_rows = tokens(9, 32, torch.float32, n_cache_rows=9)
    k_rot, v_rot = layer.caches(9)
    q_rot = layer.run(x, positions + 1, cache_rows, k_rot, v_rot, "triton")
    k_id, v_id = layer.caches(9)
    q_id = layer.run(x, torch.zeros_like(positions), cache_rows, k_id, v_id, "triton")
    plain = (x @ layer.w.T).view(9, 6, 16)
    assert rel_err(q_id.view(9, 2, 16), plain[:, :2]) <= 1e-5
    assert rel_err(k_id[cache_rows].view(9, 2, 16), plain[:, 2:4]) <= 1e-5
    assert rel_err(q_rot, q_id) > 1e-2 and rel_err(k_rot, k_id) > 1e-2
    assert torch.equal(v_rot, v_id)


def test_no_tokens_writes_nothing():
    layer = Layer(4, 2, head_dim=16, d_model=64, bias=True, dtype=torch.float32)
    k_cache, v_cache = layer.caches(8)
    k_before, v_before = k_cache.clone(), v_cache.clone()
    empty = torch.empty(0, dtype=torch.long, device=DEVICE)
    q = layer.call(FusedQKVRopeCache("triton", 4, 2, check_inputs=True), torch.empty(0, 64, device=DEVICE), empty,
                   empty, k_cache, v_cache)
    assert q.shape == (0, 64) and same_bits((k_cache, k_before), (v_cache, v_before))


# ---- the op: bound once, same bits, checks on request, forcing ------------------------------------------------

@pytest.fixture(params=["pointer", "tma", "streamk"])
def forced_path(request):
    """Each kernel path forced with its default configs (the interpreter: one each)."""
    if request.param != "pointer" and not CAN_RUN_TMA:
        pytest.skip("the TMA paths need tensor descriptors and (on CUDA) compute capability >= 9")
    with forced_fused_qkv(path=request.param):
        yield request.param


def test_op_gives_the_functional_dispatchers_bits(forced_path):
    """First call (binds), second call (only launches), out= and the functional form: the same bits."""
    layer = Layer(4, 2, head_dim=128, d_model=96, bias=True, dtype=torch.float32)
    x, positions, cache_rows = tokens(17, 96, torch.float32, n_cache_rows=40)
    op = FusedQKVRopeCache("triton", 4, 2)
    q_first = compare(layer, x, positions, cache_rows, 40, run=lambda *args: layer.call(op, *args))
    k_first, v_first = layer.caches(40)
    layer.call(op, x, positions, cache_rows, k_first, v_first)
    assert op.bound_choice(x, layer.w, layer.b).path == forced_path
    k_fn, v_fn = layer.caches(40)
    q_fn = layer.run(x, positions, cache_rows, k_fn, v_fn, "triton")
    k_out, v_out = layer.caches(40)
    out = torch.full_like(q_fn, float("nan"))
    assert layer.call(op, x, positions, cache_rows, k_out, v_out, out=out) is out
    assert same_bits((q_fn, q_first), (out, q_first), (k_fn, k_first), (v_fn, v_first), (k_out, k_first),
                     (v_out, v_first))


def test_torch_op_is_the_reference():
    layer = Layer(4, 2, head_dim=16, d_model=64, bias=True, dtype=torch.float32)
    x, positions, cache_rows = tokens(7, 64, torch.float32, n_cache_rows=12)
    (k_op, v_op), (k_ref, v_ref) = layer.caches(12), layer.caches(12)
    q_op = layer.call(FusedQKVRopeCache("torch", 4, 2), x, positions, cache_rows, k_op, v_op)
    q_ref = fused_qkv_rope_cache_reference(x, layer.w, layer.b, layer.cos, layer.sin, positions, cache_rows, k_ref,
                                           v_ref, 4, 2)
    assert same_bits((q_op, q_ref), (k_op, k_ref), (v_op, v_ref))


def test_a_steady_call_binds_nothing(forced_path):
    """After the first call of a buffer, calls with new contents in the same buffers resolve, time, bind and
    build nothing (and read the new contents); a new x buffer binds a launcher without choosing again; a new
    token bucket chooses again. d_model 112: a geometry no other test uses, so the first call chooses here."""
    layer = Layer(4, 2, head_dim=128, d_model=112, bias=True, dtype=torch.float32)
    x, positions, cache_rows = tokens(17, 112, torch.float32, n_cache_rows=40)
    k_cache, v_cache = layer.caches(40)
    op = FusedQKVRopeCache("triton", 4, 2)
    start = fused_qkv_counters()
    layer.call(op, x, positions, cache_rows, k_cache, v_cache)
    first = fused_qkv_counters()
    assert (first.resolutions, first.launchers_built) == (start.resolutions + 1, start.launchers_built + 1)
    x_new, positions_new, rows_new = tokens(17, 112, torch.float32, n_cache_rows=40, seed=7)
    for _ in range(2):
        x.copy_(x_new)
        positions.copy_(positions_new)
        cache_rows.copy_(rows_new)
        compare(layer, x, positions, cache_rows, 40, run=lambda *args: layer.call(op, *args))
    assert fused_qkv_counters() == first
    layer.call(op, x_new, positions_new, rows_new, k_cache, v_cache)  # same shape, another x buffer
    rebound = fused_qkv_counters()
    assert (rebound.resolutions, rebound.measurements) == (first.resolutions, first.measurements)
    assert rebound.launchers_built == first.launchers_built + 1
    assert rebound.descriptors_built == first.descriptors_built + (0 if forced_path == "pointer" else 2)
    x_big, positions_big, rows_big = tokens(40, 112, torch.float32, n_cache_rows=40)  # bucket 64, not 32
    layer.call(op, x_big, positions_big, rows_big, k_cache, v_cache)
    assert fused_qkv_counters().resolutions == rebound.resolutions + 1


def fake_timer(times_ms: list[float]):
    """A `measure` for the tuner that runs the launch and reports the next scripted time (and no more)."""
    scripted = iter(times_ms)

    def measure(fn):
        fn()
        return next(scripted)

    return measure


def test_tuning_times_each_candidate_once_and_keeps_the_fastest():
    """Two pointer configs, timed (faked) 2.0 and 1.0 ms: the second is bound; a further call of the bucket
    times nothing (a third timing would exhaust the fake)."""
    candidates = [pointer_module.PointerConfig(16, 16, 32, 1, 4), pointer_module.PointerConfig(32, 32, 64, 1, 4, 2)]
    measure = fake_timer([2.0, 1.0])
    layer = Layer(4, 2, head_dim=16, d_model=64, bias=True, dtype=torch.float32)
    x, positions, cache_rows = tokens(9, 64, torch.float32, n_cache_rows=20)
    op = FusedQKVRopeCache("triton", 4, 2)
    with forced_fused_qkv(path="pointer", pointer_configs=candidates, measure=measure):
        before = fused_qkv_counters()
        compare(layer, x, positions, cache_rows, 20, run=lambda *args: layer.call(op, *args))
        assert fused_qkv_counters().measurements == before.measurements + 2
        key = fused_qkv_problem_key(x, layer.w, True, 4)
        assert fused_qkv_choice(key) == FusedQKVChoice("pointer", candidates[1])
        assert op.bound_choice(x, layer.w, layer.b) == fused_qkv_choice(key)
        x_other, positions_other, rows_other = tokens(13, 64, torch.float32, n_cache_rows=20, seed=3)  # same bucket
        compare(layer, x_other, positions_other, rows_other, 20, run=lambda *args: layer.call(op, *args))
    assert fused_qkv_counters().measurements == before.measurements + 2


@needs_tma
def test_auto_measures_each_path_once_and_keeps_the_fastest():
    """auto over the four paths (one config each), timed (faked) 3, 2, 1, 4 ms in that order: stream-K is
    bound, and the result is exact; the next call measures nothing."""
    configs = {"pointer_configs": [pointer_module.INTERPRETER_CONFIG],
               "tma_configs": [tma_module.INTERPRETER_CONFIGS["wide1"]],
               "streamk_configs": [streamk_module.INTERPRETER_CONFIGS["one_head"]]}
    measure = fake_timer([3.0, 2.0, 1.0, 4.0])
    layer = Layer(4, 2, head_dim=128, d_model=96, bias=True, dtype=torch.float32)
    x, positions, cache_rows = tokens(17, 96, torch.float32, n_cache_rows=40)
    op = FusedQKVRopeCache("triton", 4, 2)
    with forced_fused_qkv(auto_paths=KERNEL_PATHS, measure=measure, **configs):
        for _ in range(2):
            compare(layer, x, positions, cache_rows, 40, run=lambda *args: layer.call(op, *args))
        assert fused_qkv_choice(fused_qkv_problem_key(x, layer.w, True, 4)) == FusedQKVChoice(
            "streamk", streamk_module.INTERPRETER_CONFIGS["one_head"])
        assert op.bound_choice(x, layer.w, layer.b).path == "streamk"


def test_auto_keeps_the_vendor_gemm_when_it_is_fastest():
    """The cublas path (F.linear, then RoPE and the cache write) timed fastest (faked 3, 1 ms after the pointer
    kernel) is bound, and its outputs match the reference."""
    measure = fake_timer([3.0, 1.0])
    layer = Layer(4, 2, head_dim=16, d_model=64, bias=True, dtype=torch.float32)
    x, positions, cache_rows = tokens(11, 64, torch.float32, n_cache_rows=30)
    op = FusedQKVRopeCache("triton", 4, 2)
    with forced_fused_qkv(auto_paths=("pointer", "cublas"), measure=measure,
                          pointer_configs=[pointer_module.INTERPRETER_CONFIG]):
        for _ in range(2):
            compare(layer, x, positions, cache_rows, 30, fill=float("nan"), run=lambda *args: layer.call(op, *args))
        assert op.bound_choice(x, layer.w, layer.b).path == "cublas"


def test_a_candidate_that_computes_wrong_is_never_chosen(monkeypatch):
    """Before auto times a candidate it runs it once into scratch outputs against the torch reference: the cublas
    path made to write a wrong q (timed fastest, faked) is dropped with a warning, the pointer kernel is bound,
    and the real cache is never written by the check."""
    from flash_dllm.kernels import _fused_qkv_cublas

    working = _fused_qkv_cublas.CublasLauncher.__call__

    def wrong(self, x, w_qkv, b_qkv, cos, sin, positions, cache_rows, q, k_cache, v_cache):
        working(self, x, w_qkv, b_qkv, cos, sin, positions, cache_rows, q, k_cache, v_cache)
        q[:, :8].neg_()  # one head's first half

    monkeypatch.setattr(_fused_qkv_cublas.CublasLauncher, "__call__", wrong)
    layer = Layer(4, 2, head_dim=16, d_model=64, bias=True, dtype=torch.float32)
    x, positions, cache_rows = tokens(11, 64, torch.float32, n_cache_rows=30)
    op = FusedQKVRopeCache("triton", 4, 2)
    before = fused_qkv_counters()
    with forced_fused_qkv(auto_paths=("pointer", "cublas"), measure=fake_timer([3.0]),
                          pointer_configs=[pointer_module.INTERPRETER_CONFIG]):
        with pytest.warns(UserWarning, match="cublas config .* computes wrong here"):
            compare(layer, x, positions, cache_rows, 30, fill=float("nan"), run=lambda *args: layer.call(op, *args))
        assert op.bound_choice(x, layer.w, layer.b).path == "pointer"
    assert fused_qkv_counters().rejected == before.rejected + 1


def test_the_reference_check_stands_aside_when_the_inputs_are_not_finite(recwarn):
    """A tuned call whose x holds a NaN row (a buffer never written) leaves the reference nothing to compare
    against: every candidate is timed as before the check existed, none is rejected."""
    layer = Layer(4, 2, head_dim=16, d_model=64, bias=True, dtype=torch.float32)
    x, positions, cache_rows = tokens(11, 64, torch.float32, n_cache_rows=30)
    x[3] = float("nan")
    k_cache, v_cache = layer.caches(30)
    op = FusedQKVRopeCache("triton", 4, 2)
    before = fused_qkv_counters()
    with forced_fused_qkv(auto_paths=("pointer", "cublas"), measure=fake_timer([3.0, 1.0]),
                          pointer_configs=[pointer_module.INTERPRETER_CONFIG]):
        layer.call(op, x, positions, cache_rows, k_cache, v_cache)
        assert op.bound_choice(x, layer.w, layer.b).path == "cublas"
    assert fused_qkv_counters().rejected == before.rejected
    assert not [w for w in recwarn if "computes wrong" in str(w.message)]


def test_check_inputs_names_what_is_wrong(monkeypatch):
    layer = Layer(4, 2, head_dim=16, d_model=64, bias=True, dtype=torch.float32)
    x, positions, cache_rows = tokens(5, 64, torch.float32, n_cache_rows=12)
    k_cache, v_cache = layer.caches(12)
    good = {"x": x, "w_qkv": layer.w, "b_qkv": layer.b, "cos": layer.cos, "sin": layer.sin, "positions": positions,
            "cache_rows": cache_rows, "k_cache": k_cache, "v_cache": v_cache}
    wrong = [({"x": x.double()}, "x .*torch.float64.* and w_qkv .*torch.float32.* must share a dtype"),
             ({"w_qkv": layer.w[:-1]}, "w_qkv must have .* rows: 127 rows for 8 heads"),
             ({"w_qkv": torch.zeros(8 * 15, 64, device=DEVICE)}, "even head dim, got 15"),
             ({"cos": layer.cos[:, :4]}, r"cos/sin must be \[P, 8\]"),
             ({"k_cache": k_cache.T.contiguous().T}, "k_cache must be contiguous in its last dimension"),
             ({"v_cache": v_cache[:, :16]}, r"v_cache must be \[R, 32\], got \(12, 16\)"),
             ({"b_qkv": layer.b[:-1]}, r"b_qkv must be \[128\], got \(127,\)"),
             ({"positions": positions[:-1]}, "positions and cache_rows must have one entry per token"),
             ({"out": torch.empty(5, 63, device=DEVICE)}, r"out must be \[5, 64\]")]
    for backend in ("triton", "torch"):
        op = FusedQKVRopeCache(backend, 4, 2, check_inputs=True)
        for change, message in wrong:
            with pytest.raises(ValueError, match=message):
                op(**{**good, **change})
        op(**good)
    assert not FusedQKVRopeCache("triton", 4, 2).check_inputs
    monkeypatch.setenv(CHECK_ENV, "1")  # read when an op is built
    assert FusedQKVRopeCache("triton", 4, 2).check_inputs


def test_forced_fused_qkv_restores_the_previous_forcing_even_after_an_exception():
    layer = Layer(4, 2, head_dim=16, d_model=64, bias=True, dtype=torch.float32)
    x, positions, cache_rows = tokens(5, 64, torch.float32, n_cache_rows=12)
    k_cache, v_cache = layer.caches(12)
    op = FusedQKVRopeCache("triton", 4, 2)
    pinned = pointer_module.PointerConfig(16, 16, 32, 1, 4, group_m=2)  # in no default candidate list
    outside = current_fused_qkv_forcing()
    layer.call(op, x, positions, cache_rows, k_cache, v_cache)
    with pytest.raises(ValueError, match="streamk requested .*, but"):  # head dim 16: no TMA
        with forced_fused_qkv(path="streamk"):
            assert current_fused_qkv_forcing().path == "streamk"
            assert op.bound_choice(x, layer.w, layer.b) is None  # bound under another forcing
            with forced_fused_qkv(path="pointer", pointer_configs=[pinned]):
                layer.call(op, x, positions, cache_rows, k_cache, v_cache)
                assert op.bound_choice(x, layer.w, layer.b) == FusedQKVChoice("pointer", pinned)
            assert current_fused_qkv_forcing().path == "streamk"
            layer.call(op, x, positions, cache_rows, k_cache, v_cache)
    assert current_fused_qkv_forcing() is outside
    assert op.bound_choice(x, layer.w, layer.b) is None
    layer.call(op, x, positions, cache_rows, k_cache, v_cache)
    bound = op.bound_choice(x, layer.w, layer.b)
    assert bound.path == "pointer" and bound.config != pinned
    with pytest.raises(ValueError, match="unknown fused QKV kernel path 'cutlass'"):
        with forced_fused_qkv(path="cutlass"):
            pass
    assert current_fused_qkv_forcing() is outside


def test_importing_the_op_module_does_not_import_triton():
    code = ("import sys, torch\n"
            "import flash_dllm.kernels.fused_qkv_rope_cache as m\n"
            "op = m.FusedQKVRopeCache('torch', 2, 1)\n"
            "x = torch.randn(3, 16); w = torch.randn(32, 16); cos = sin = torch.ones(8, 4)\n"
            "k = torch.zeros(5, 8); v = torch.zeros(5, 8); idx = torch.arange(3)\n"
            "op(x, w, None, cos, sin, idx, idx, k, v)\n"
            "assert 'triton' not in sys.modules, 'triton imported'\n"
            "m.forced_fused_qkv\n"
            "assert 'triton' in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True)


# ---- TMA kernels (interpreter, or a CUDA device of compute capability >= 9) -----------------------------------

@pytest.fixture(params=[("tma", name) for name in sorted(tma_module.INTERPRETER_CONFIGS)]
                + [("streamk", name) for name in sorted(streamk_module.INTERPRETER_CONFIGS)],
                ids=lambda param: "-".join(param))
def hopper_kernel(request):
    """Force one of the two TMA paths with one config shape; returns the path name. tma: that config only;
    streamk: data-parallel tiles, whole tail tiles, tail tiles split over 2-3 programs and (balanced) ranges
    running on into the next tile."""
    path, name = request.param
    with forced(path, name):
        yield path


@pytest.fixture(params=sorted(streamk_module.INTERPRETER_CONFIGS))
def streamk_config(request):
    with forced("streamk", request.param):
        yield request.param


@needs_tma
@pytest.mark.parametrize("n_tokens", [1, 3, 17, 129])
@pytest.mark.parametrize("n_heads,n_kv_heads,bias,d_model", [(4, 4, False, 64), (4, 2, True, 96), (3, 1, True, 80)],
                         ids=["mha", "gqa-bias", "odd-heads-bias"])
def test_tma_matches_reference_fp32(hopper_kernel, n_heads, n_kv_heads, bias, d_model, n_tokens):
    """3 + 2 heads: two-head tiles straddle q|k and the last one runs past the weight (TMA zero-fill);
    d_model 96 / 80 leave a K tail for 64-wide K tiles (80 also for 32-wide ones). Cache NaN-poisoned."""
    layer = Layer(n_heads, n_kv_heads, head_dim=128, d_model=d_model, bias=bias, dtype=torch.float32)
    n_cache_rows = 2 * n_tokens + 7
    x, positions, cache_rows = tokens(n_tokens, d_model, torch.float32, n_cache_rows)
    compare(layer, x, positions, cache_rows, n_cache_rows, fill=float("nan"))
    assert fused_qkv_choice(fused_qkv_problem_key(x, layer.w, bias, n_heads)).path == hopper_kernel


@needs_tma
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_tma_half_precisions(hopper_kernel, dtype):
    layer = Layer(4, 2, head_dim=128, d_model=96, bias=True, dtype=dtype, theta=1e6)
    x, positions, cache_rows = tokens(33, 96, dtype, n_cache_rows=80)
    compare(layer, x, positions, cache_rows, 80)


@needs_tma
def test_tma_int32_indices_and_rope_on_q_k_only(hopper_kernel):
    layer = Layer(2, 2, head_dim=128, d_model=64, bias=False, dtype=torch.float32)
    x, positions, cache_rows = tokens(9, 64, torch.float32, n_cache_rows=9)
    compare(layer, x, positions.int(), cache_rows.int(), 9)
    k_id, v_id = layer.caches(9)
    q_id = layer.run(x, torch.zeros_like(positions), cache_rows, k_id, v_id, "triton")
    plain = (x @ layer.w.T).view(9, 6, 128)
    assert rel_err(q_id.view(9, 2, 128), plain[:, :2]) <= 1e-5
    assert rel_err(k_id[cache_rows].view(9, 2, 128), plain[:, 2:4]) <= 1e-5
    assert rel_err(v_id[cache_rows].view(9, 2, 128), plain[:, 4:]) <= 1e-5


@needs_tma
@pytest.mark.parametrize("n_heads,n_kv_heads,d_model,n_tokens", [(4, 2, 96, 1), (3, 1, 80, 5)])
def test_streamk_reads_only_partials_of_this_launch(streamk_config, n_heads, n_kv_heads, d_model, n_tokens):
    """A NaN-poisoned workspace between two launches changes no bit (the last contributor of a split tile reads
    exactly the partials this launch wrote, summed in contributor order), and every launch leaves the arrival
    counters at zero. Under the interpreter each tile shape splits tail tiles in one of the two problems."""
    layer = Layer(n_heads, n_kv_heads, head_dim=128, d_model=d_model, bias=True, dtype=torch.float32)
    x, positions, cache_rows = tokens(n_tokens, d_model, torch.float32, n_cache_rows=12)
    k1, v1 = layer.caches(12)
    q1 = layer.run(x, positions, cache_rows, k1, v1, "triton")
    buffers = streamk_module.streamk_buffers(x.device)
    buffers.workspace.fill_(float("nan"))
    k2, v2 = layer.caches(12)
    q2 = layer.run(x, positions, cache_rows, k2, v2, "triton")
    assert same_bits((q1, q2), (k1, k2), (v1, v2))
    assert int(buffers.arrivals.abs().sum()) == 0


def tail_pieces(plan):
    """(program, tile, first step, end step) of every tail piece, walked as the kernel walks its range."""
    start, owner = streamk_module._range_start.fn, streamk_module._range_owner.fn
    work = plan.tail_tiles * plan.iters
    pieces = []
    for program in range(plan.tail_programs):
        step, end = start(program, work, plan.tail_programs), start(program + 1, work, plan.tail_programs)
        assert step < end, "every tail program has K steps"
        while step < end:
            tile = step // plan.iters
            piece_end = min(end - tile * plan.iters, plan.iters)
            pieces.append((program, tile, step - tile * plan.iters, piece_end))
            assert owner(step, work, plan.tail_programs) == program
            step = tile * plan.iters + piece_end
    return pieces


@pytest.mark.parametrize("balanced", [False, True], ids=["aligned", "balanced"])
@pytest.mark.parametrize("n_programs", [7, 132])
def test_streamk_schedule_covers_each_tail_tile_exactly(n_programs, balanced):
    """The schedule and the kernel's range arithmetic: data-parallel waves are whole; each tail tile's pieces
    cover its K steps once, come from the programs _range_owner names for its first and last step, and a
    program's partial slots (2p first piece, 2p + 1 later) never collide."""
    straddles = 0
    for n_tiles in range(1, 3 * n_programs):
        for d_model, block_k in ((64, 64), (80, 32), (3584, 64), (4096, 128)):
            plan = streamk_module.schedule(n_tiles, n_programs, d_model, block_k, balanced)
            assert plan.n_full % n_programs == 0 and plan.n_full + plan.tail_tiles == n_tiles
            assert 0 <= plan.tail_tiles < n_programs and plan.tail_programs <= n_programs
            work = plan.tail_tiles * plan.iters
            owner, start = streamk_module._range_owner.fn, streamk_module._range_start.fn
            pieces = tail_pieces(plan)
            slots = set()
            for tile in range(plan.tail_tiles):
                mine = [p for p in pieces if p[1] == tile]
                assert [p[0] for p in mine] == list(range(owner(tile * plan.iters, work, plan.tail_programs),
                                                          owner((tile + 1) * plan.iters - 1, work,
                                                                plan.tail_programs) + 1))
                assert [(a, b) for _, _, a, b in mine] == [(a, b) for a, b in zip(
                    [0] + [b for _, _, _, b in mine[:-1]], [b for _, _, _, b in mine])]
                assert mine[0][2] == 0 and mine[-1][3] == plan.iters
                for program, _, _, _ in mine if len(mine) > 1 else ():
                    slot = 2 * program + (start(program, work, plan.tail_programs) < tile * plan.iters)
                    assert slot not in slots
                    slots.add(slot)
            straddles += sum(1 for a, b in zip(pieces, pieces[1:]) if a[0] == b[0])
            if not balanced:
                assert all(len([p for p in pieces if p[0] == g]) == 1 for g in range(plan.tail_programs))
    assert (straddles > 0) == balanced
    assert streamk_module.schedule(36, 132, 3584, 64, False) == streamk_module.TailSchedule(0, 36, 108, 56)
    assert streamk_module.schedule(36, 132, 3584, 64, True) == streamk_module.TailSchedule(0, 36, 132, 56)
    assert streamk_module.schedule(144, 132, 3584, 64, False) == streamk_module.TailSchedule(132, 12, 132, 56)


def test_streamk_interpreter_problems_split_and_straddle():
    """The interpreter configs meet every tail case on the tests' problems: whole tail tiles, tiles split over
    programs and (balanced) a program whose range runs from one tile into the next."""
    seen = set()
    for name, config in streamk_module.INTERPRETER_CONFIGS.items():
        for n_heads, n_kv_heads, d_model in ((4, 4, 64), (4, 2, 96), (3, 1, 80)):
            for n_tokens in (1, 3, 5, 17, 33, 129):
                n_tiles = -(-n_tokens // config.block_m) * -(-(n_heads + 2 * n_kv_heads) // config.heads)
                plan = streamk_module.schedule(n_tiles, streamk_module.INTERPRETER_PROGRAMS, d_model,
                                               config.block_k, config.balanced)
                pieces = tail_pieces(plan)
                seen |= {"data-parallel"} if plan.n_full else set()
                for tile in range(plan.tail_tiles):
                    seen.add("whole" if len([p for p in pieces if p[1] == tile]) == 1 else f"split-{name}")
                if any(a[0] == b[0] for a, b in zip(pieces, pieces[1:])):
                    seen.add(f"straddle-{name}")
    assert {"data-parallel", "whole", "split-one_head", "split-two_heads", "split-one_head_balanced",
            "straddle-one_head_balanced"} <= seen


def test_path_requests_and_what_each_may_run():
    """auto: pointer on CPU tensors / under the interpreter; a forced TMA path runs, or is refused with a reason.
    FLASH_DLLM_FUSED_QKV_PATH is parsed from a given environment (ops read os.environ once, when built)."""
    w = torch.zeros(6 * 128, 64)
    x = torch.zeros(5, 64)
    assert read_path_request({}) == read_path_request({PATH_ENV: " "}) == "auto"
    assert read_path_request({PATH_ENV: " TMA "}) == "tma"
    assert read_path_request({PATH_ENV: "cuBLAS"}) == "cublas"
    with pytest.raises(ValueError, match=f"{PATH_ENV}='cutlass'.*auto, pointer, tma, streamk, cublas"):
        read_path_request({PATH_ENV: "cutlass"})
    for interpreter in (True, False):  # nothing to time with on CPU tensors: auto runs the pointer kernel
        assert fused_qkv_paths("auto", x, w, 128, interpreter) == ("pointer",)
        assert fused_qkv_paths("pointer", x, w, 128, interpreter) == ("pointer",)
        assert fused_qkv_paths("cublas", x, w, 128, interpreter) == ("cublas",)
    if not tma_available():
        return
    assert fused_qkv_paths("tma", x, w, 128, interpreter=True) == ("tma",)  # the interpreter runs descriptors
    assert fused_qkv_paths("streamk", x, w, 128, interpreter=True) == ("streamk",)
    assert fused_qkv_paths("auto", x, w, 128, True, auto_paths=KERNEL_PATHS) == KERNEL_PATHS
    narrow = torch.zeros(6 * 64, 64)
    assert fused_qkv_paths("auto", x, narrow, 64, True, auto_paths=KERNEL_PATHS) == ("pointer", "cublas")
    with pytest.raises(ValueError, match="head dim 128"):
        fused_qkv_paths("tma", x, narrow, 64, interpreter=True)
    with pytest.raises(ValueError, match="contiguous"):
        fused_qkv_paths("tma", torch.zeros(64, 5).T, w, 128, interpreter=True)
    with pytest.raises(ValueError, match="16-byte"):
        fused_qkv_paths("tma", torch.zeros(5, 58), torch.zeros(6 * 128, 58), 128, interpreter=True)  # 232-byte rows
    with pytest.raises(ValueError, match="streamk requested .*, but x is on cpu, not a CUDA device"):
        fused_qkv_paths("streamk", x, w, 128, interpreter=False)  # compiled Triton on CPU tensors: no TMA


# ---- full model geometry (GPU only) ------------------------------------------------------------------------

@needs_gpu
@pytest.mark.parametrize("n_tokens", [1, 17, 128, 1000, 4096])
@pytest.mark.parametrize("model", sorted(MODELS))
def test_full_layer_bf16(model, n_tokens):
    n_heads, n_kv_heads, head_dim, d_model, bias, theta = MODELS[model]
    layer = Layer(n_heads, n_kv_heads, head_dim, d_model, bias, torch.bfloat16, theta)
    n_cache_rows = 2 * 4096 + 128
    x, positions, cache_rows = tokens(n_tokens, d_model, torch.bfloat16, n_cache_rows)
    with forced_fused_qkv(path="pointer"):  # the TMA kernels have their own full-layer test below
        compare(layer, x, positions, cache_rows, n_cache_rows, fill=float("nan"))


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["fp16", "fp32"])
def test_full_layer_other_dtypes(dtype):
    n_heads, n_kv_heads, head_dim, d_model, bias, theta = MODELS["dream-7b"]
    layer = Layer(n_heads, n_kv_heads, head_dim, d_model, bias, dtype, theta)
    n_tokens = 200 if dtype == torch.float16 else 9  # fp32 (exact "ieee" dots) only at decode size
    x, positions, cache_rows = tokens(n_tokens, d_model, dtype, 1024)
    compare(layer, x, positions, cache_rows, 1024)


def compiled_variants(kernel) -> int:
    fn = kernel
    while not hasattr(fn, "device_caches"):  # wrappers hold the JITFunction in .fn
        fn = fn.fn
    return sum(len(entry[0]) for entry in fn.device_caches.values())


def assert_token_count_does_not_recompile(kernel):
    n_heads, n_kv_heads, head_dim, d_model, bias, theta = MODELS["dream-7b"]
    layer = Layer(n_heads, n_kv_heads, head_dim, d_model, bias, torch.bfloat16, theta)
    k_cache, v_cache = layer.caches(512)
    counts = []
    for n_tokens in (70, 97, 128, 101):  # one token bucket, four token counts
        x, positions, cache_rows = tokens(n_tokens, d_model, torch.bfloat16, 512)
        layer.run(x, positions, cache_rows, k_cache, v_cache, "triton")
        counts.append(compiled_variants(kernel))
    assert counts[0] >= 1 and counts[1:] == counts[:1] * 3, counts


@needs_gpu
def test_token_count_does_not_recompile():
    with forced_fused_qkv(path="pointer"):
        assert_token_count_does_not_recompile(pointer_module._fused_qkv_pointer_kernel)


@needs_hopper
def test_tma_token_count_does_not_recompile():
    with forced_fused_qkv(path="tma"):
        assert_token_count_does_not_recompile(tma_module._fused_qkv_tma_kernel)


@needs_hopper
@pytest.mark.parametrize("path", ["tma", "streamk"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("n_tokens", [1, 7, 128, 1000, 4096])
@pytest.mark.parametrize("model", sorted(MODELS))
def test_tma_full_layer(model, n_tokens, dtype, path):
    """Both Hopper schedules at LLaDA-8B (MHA) and Dream-7B (GQA, bias) geometry, NaN-poisoned caches."""
    n_heads, n_kv_heads, head_dim, d_model, bias, theta = MODELS[model]
    layer = Layer(n_heads, n_kv_heads, head_dim, d_model, bias, dtype, theta)
    n_cache_rows = 2 * 4096 + 128
    x, positions, cache_rows = tokens(n_tokens, d_model, dtype, n_cache_rows)
    with forced_fused_qkv(path=path):
        compare(layer, x, positions, cache_rows, n_cache_rows, fill=float("nan"))


@needs_hopper
@pytest.mark.parametrize("config", streamk_module.CUDA_CONFIGS, ids=str)
@pytest.mark.parametrize("model,n_tokens", [("dream-7b", 128), ("dream-7b", 1000), ("llada-8b", 4096)])
def test_streamk_every_cuda_config_is_exact_and_reproducible(model, n_tokens, config):
    """Each stream-K config the tuner may pick (aligned and balanced tails) matches the reference at full layer
    shapes, and three launches give the same bits: the last contributor of a split tile differs from run to
    run on a GPU, the sum order does not."""
    n_heads, n_kv_heads, head_dim, d_model, bias, theta = MODELS[model]
    layer = Layer(n_heads, n_kv_heads, head_dim, d_model, bias, torch.bfloat16, theta)
    x, positions, cache_rows = tokens(n_tokens, d_model, torch.bfloat16, 2 * 4096)
    with forced_fused_qkv(path="streamk", streamk_configs=[config]):
        compare(layer, x, positions, cache_rows, 2 * 4096, fill=float("nan"))
        runs = []
        for _ in range(3):
            k_cache, v_cache = layer.caches(2 * 4096)
            runs.append((layer.run(x, positions, cache_rows, k_cache, v_cache, "triton"), k_cache, v_cache))
    for later in runs[1:]:
        assert same_bits(*zip(runs[0], later))
    assert int(streamk_module.streamk_buffers(x.device).arrivals.abs().sum()) == 0


@needs_hopper
@pytest.mark.parametrize("n_tokens", [128, 1000])
@pytest.mark.parametrize("model", sorted(MODELS))
def test_auto_path_measures_and_keeps_its_choice(model, n_tokens):
    """auto times the three kernels on the first call of a problem (a forced measure: choices of its own),
    binds the fastest, and measures nothing on the next call."""
    n_heads, n_kv_heads, head_dim, d_model, bias, theta = MODELS[model]
    layer = Layer(n_heads, n_kv_heads, head_dim, d_model, bias, torch.bfloat16, theta)
    x, positions, cache_rows = tokens(n_tokens, d_model, torch.bfloat16, 2 * 4096)
    op = FusedQKVRopeCache("triton", n_heads, n_kv_heads)
    with forced_fused_qkv(auto_paths=KERNEL_PATHS, measure=lambda fn: gpu_time_ms(fn)):
        before = fused_qkv_counters()
        compare(layer, x, positions, cache_rows, 2 * 4096, run=lambda *args: layer.call(op, *args))
        measured = fused_qkv_counters()
        assert measured.measurements > before.measurements + len(KERNEL_PATHS)  # configs, then paths
        choice = fused_qkv_choice(fused_qkv_problem_key(x, layer.w, bias, n_heads))
        assert choice.path in KERNEL_PATHS and op.bound_choice(x, layer.w, layer.b) == choice
        compare(layer, x, positions, cache_rows, 2 * 4096, run=lambda *args: layer.call(op, *args))
        assert fused_qkv_counters().measurements == measured.measurements


@needs_gpu
@pytest.mark.parametrize("path", ["pointer", "tma", "streamk", "auto"])
@pytest.mark.parametrize("model", sorted(MODELS))
def test_cuda_graph_replays_match_eager_calls(model, path):
    """One eager call binds; a captured call then binds, tunes and builds nothing, and replays with new x /
    positions / cache_rows contents copied into the captured buffers give the eager call's bits."""
    if path in ("tma", "streamk") and not (HOPPER and tma_available()):
        pytest.skip("the TMA paths need compute capability >= 9")
    n_heads, n_kv_heads, head_dim, d_model, bias, theta = MODELS[model]
    layer = Layer(n_heads, n_kv_heads, head_dim, d_model, bias, torch.bfloat16, theta)
    n_cache_rows = 1024
    x, positions, cache_rows = tokens(128, d_model, torch.bfloat16, n_cache_rows)
    k_cache, v_cache = layer.caches(n_cache_rows)
    op = FusedQKVRopeCache("triton", n_heads, n_kv_heads)
    with forced_fused_qkv(path=None if path == "auto" else path):
        layer.call(op, x, positions, cache_rows, k_cache, v_cache)
        torch.cuda.synchronize()
        before = fused_qkv_counters()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            q_graph = layer.call(op, x, positions, cache_rows, k_cache, v_cache)
        assert fused_qkv_counters() == before
        for seed in (5, 6):
            x_new, positions_new, rows_new = tokens(128, d_model, torch.bfloat16, n_cache_rows, seed=seed)
            k_eager, v_eager = k_cache.clone(), v_cache.clone()
            q_eager = layer.call(op, x_new, positions_new, rows_new, k_eager, v_eager)
            x.copy_(x_new)
            positions.copy_(positions_new)
            cache_rows.copy_(rows_new)
            graph.replay()
            torch.cuda.synchronize()
            assert same_bits((q_graph, q_eager), (k_cache, k_eager), (v_cache, v_eager))
        assert path == "auto" or op.bound_choice(x, layer.w, layer.b).path == path


@needs_gpu
def test_a_first_call_inside_cuda_graph_capture_refuses_to_tune():
    layer = Layer(4, 2, head_dim=128, d_model=256, bias=True, dtype=torch.bfloat16)
    x, positions, cache_rows = tokens(16, 256, torch.bfloat16, n_cache_rows=64)
    k_cache, v_cache = layer.caches(64)
    op = FusedQKVRopeCache("triton", 4, 2)
    with forced_fused_qkv(path="pointer", measure=lambda fn: gpu_time_ms(fn)):  # choices of its own: none yet
        with pytest.raises(RuntimeError, match="call the op once eagerly"):
            with torch.cuda.graph(torch.cuda.CUDAGraph()):
                layer.call(op, x, positions, cache_rows, k_cache, v_cache)
