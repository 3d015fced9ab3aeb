"""Fused QKV + RoPE + cache-write kernel vs the plain-PyTorch reference.

Runs the Triton kernel through the CPU interpreter (TRITON_INTERPRET=1, small shapes) or, with
TRITON_INTERPRET=0 on a CUDA machine, on the GPU, where the full LLaDA-8B / Dream-7B layer shapes also run.

Tolerances (relative Frobenius-norm error vs the reference):
  fp32 1e-5 (fp32 accumulation on both sides, only the summation order differs);
  fp16 2e-3 and bf16 1e-2: the kernel rounds once after RoPE, the reference rounds the projection and
  again after RoPE, and the interpreter stores bf16 by truncation (measured ~4e-3 against the reference).
Cache rows that no token names must stay bit-identical.

Two kernels sit behind the Triton backend: the pointer kernel (any GPU, the interpreter's default) and the
TMA kernels (compute capability >= 9, head dim 128: a data-parallel grid and a stream-K schedule);
FLASH_DLLM_FUSED_QKV_PATH forces one. The TMA tests force them, under the interpreter too (which runs tensor
descriptors), once per config shape (WIDE one head, WIDE two heads, SPLIT half-head column blocks; the
stream-K-tail schedule with one- and two-head tiles over 7 "SMs": whole tail tiles, tiles split over programs,
ranges running from one tile into the next).
"""
from kernel_testing import DEVICE, TOL, needs_gpu, needs_triton, rel_err  # noqa: F401  (sets TRITON_INTERPRET first)

import pytest  # noqa: E402
import torch  # noqa: E402

from flash_dllm.kernels import _fused_qkv_rope_cache_streamk as streamk_module  # noqa: E402
from flash_dllm.kernels import _fused_qkv_rope_cache_tma as tma_module  # noqa: E402
from flash_dllm.kernels import _fused_qkv_rope_cache_triton as dispatch  # noqa: E402
from flash_dllm.kernels._fused_qkv_rope_cache_triton import PATH_ENV, fused_qkv_path  # noqa: E402
from flash_dllm.kernels.fused_qkv_rope_cache import fused_qkv_rope_cache, fused_qkv_rope_cache_reference  # noqa: E402

pytestmark = needs_triton
HOPPER = DEVICE == "cuda" and torch.cuda.get_device_capability()[0] >= 9
needs_tma = pytest.mark.skipif(not tma_module.tma_available() or (DEVICE == "cuda" and not HOPPER),
                               reason="the TMA kernel needs tensor descriptors and (on CUDA) compute capability >= 9")
needs_hopper = pytest.mark.skipif(not HOPPER or not tma_module.tma_available(),
                                  reason="TMA at full model shapes runs on a CUDA device of compute capability >= 9")


def rope_tables(n_positions: int, head_dim: int, theta: float, device) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.arange(n_positions, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return angles.cos().float().to(device), angles.sin().float().to(device)


class Layer:
    """Random stacked q|k|v weight (+bias) and RoPE tables of one attention layer."""

    def __init__(self, n_heads, n_kv_heads, head_dim, d_model, bias, dtype, theta=5e5, n_positions=4608, seed=0):
        gen = torch.Generator().manual_seed(seed)
        rows = (n_heads + 2 * n_kv_heads) * head_dim
        self.n_heads, self.n_kv_heads, self.head_dim, self.dtype = n_heads, n_kv_heads, head_dim, dtype
        self.w = (torch.randn(rows, d_model, generator=gen) / d_model**0.5).to(DEVICE, dtype)
        self.b = (0.5 * torch.randn(rows, generator=gen)).to(DEVICE, dtype) if bias else None
        self.cos, self.sin = rope_tables(n_positions, head_dim, theta, DEVICE)

    def caches(self, n_rows: int, fill: float | None = None, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        width = self.n_kv_heads * self.head_dim
        if fill is not None:
            return (torch.full((n_rows, width), fill, dtype=self.dtype, device=DEVICE) for _ in range(2))
        gen = torch.Generator().manual_seed(seed)
        return (torch.randn(n_rows, width, generator=gen).to(DEVICE, self.dtype) for _ in range(2))

    def run(self, x, positions, cache_rows, k_cache, v_cache, backend):
        return fused_qkv_rope_cache(x, self.w, self.b, self.cos, self.sin, positions, cache_rows, k_cache, v_cache,
                                    self.n_heads, self.n_kv_heads, backend=backend)


def compare(layer: Layer, x, positions, cache_rows, n_cache_rows: int, fill: float | None = None):
    """Run kernel and reference on identical, separately owned caches and check every output."""
    k_kernel, v_kernel = layer.caches(n_cache_rows, fill)
    k_ref, v_ref = layer.caches(n_cache_rows, fill)
    k_before, v_before = k_kernel.clone(), v_kernel.clone()
    q_kernel = layer.run(x, positions, cache_rows, k_kernel, v_kernel, "triton")
    q_ref = fused_qkv_rope_cache_reference(x, layer.w, layer.b, layer.cos, layer.sin, positions, cache_rows,
                                           k_ref, v_ref, layer.n_heads, layer.n_kv_heads)
    tol = TOL[layer.dtype]
    assert q_kernel.dtype == x.dtype and q_kernel.shape == q_ref.shape
    assert rel_err(q_kernel, q_ref) <= tol, ("q", rel_err(q_kernel, q_ref))
    rows = cache_rows.long()
    assert rel_err(k_kernel[rows], k_ref[rows]) <= tol, ("k", rel_err(k_kernel[rows], k_ref[rows]))
    assert rel_err(v_kernel[rows], v_ref[rows]) <= tol, ("v", rel_err(v_kernel[rows], v_ref[rows]))
    untouched = torch.ones(n_cache_rows, dtype=torch.bool, device=DEVICE)
    untouched[rows] = False
    # bit-exact, NaN included: compare the raw bits of rows no token names
    assert torch.equal(k_kernel[untouched].view(torch.uint8), k_before[untouched].view(torch.uint8))
    assert torch.equal(v_kernel[untouched].view(torch.uint8), v_before[untouched].view(torch.uint8))
    return q_kernel


def tokens(n_tokens, d_model, dtype, n_cache_rows, seed=2, max_position=4096):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n_tokens, d_model, generator=gen).to(DEVICE, dtype)
    positions = torch.randint(0, max_position, (n_tokens,), generator=gen).to(DEVICE)
    cache_rows = torch.randperm(n_cache_rows, generator=gen)[:n_tokens].to(DEVICE)
    return x, positions, cache_rows


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


# ---- TMA kernels (interpreter, or a CUDA device of compute capability >= 9) -----------------------------------

STREAMK_CUDA = {"one_head": streamk_module.StreamKConfig(64, 1, 32, 3, 4),
                "two_heads": streamk_module.StreamKConfig(128, 2, 32, 2, 8),
                "one_head_balanced": streamk_module.StreamKConfig(64, 1, 32, 3, 4, balanced=True)}


def force_streamk(monkeypatch, name: str) -> None:
    """streamk path with one tile shape (interpreter: 7 programs; GPU: one CUDA config that fits fp32, untuned)."""
    monkeypatch.setenv(PATH_ENV, "streamk")
    monkeypatch.setattr(streamk_module, "interpreter_config", streamk_module.INTERPRETER_CONFIGS[name])
    monkeypatch.setattr(streamk_module, "CUDA_CONFIGS", [STREAMK_CUDA[name]])
    monkeypatch.setattr(streamk_module, "_BEST", {})


@pytest.fixture(params=[("tma", name) for name in sorted(tma_module.INTERPRETER_CONFIGS)]
                + [("streamk", name) for name in sorted(streamk_module.INTERPRETER_CONFIGS)],
                ids=lambda param: "-".join(param))
def hopper_kernel(request, monkeypatch):
    """Force one of the two TMA paths with one config shape; returns the path name. tma: the autotuner runs
    that config only; streamk: data-parallel tiles, whole tail tiles, tail tiles split over 2-3 programs and
    (balanced) ranges running on into the next tile."""
    path, name = request.param
    if path == "tma":
        monkeypatch.setenv(PATH_ENV, "tma")
        monkeypatch.setattr(tma_module._fused_qkv_rope_cache_tma_kernel, "configs",
                            [tma_module.INTERPRETER_CONFIGS[name]])
    else:
        force_streamk(monkeypatch, name)
    return path


@pytest.fixture(params=sorted(streamk_module.INTERPRETER_CONFIGS))
def streamk_config(request, monkeypatch):
    force_streamk(monkeypatch, request.param)
    return request.param


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
    assert fused_qkv_path(x, layer.w, 128) == hopper_kernel
    compare(layer, x, positions, cache_rows, n_cache_rows, fill=float("nan"))


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
    for workspace in streamk_module._WORKSPACES.values():
        workspace.fill_(float("nan"))
    k2, v2 = layer.caches(12)
    q2 = layer.run(x, positions, cache_rows, k2, v2, "triton")
    for first, second in ((q1, q2), (k1, k2), (v1, v2)):
        assert torch.equal(first.view(torch.int32), second.view(torch.int32))
    assert all(int(arrivals.abs().sum()) == 0 for arrivals in streamk_module._ARRIVALS.values())


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


def test_path_selection(monkeypatch):
    """auto: pointer on CPU / under the interpreter; the override is honoured, or refused with a reason."""
    w = torch.zeros(6 * 128, 64)
    x = torch.zeros(5, 64)
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # read per call; also on a GPU run of this file
    monkeypatch.delenv(PATH_ENV, raising=False)
    assert fused_qkv_path(x, w, 128) == "pointer"
    monkeypatch.setenv(PATH_ENV, "auto")
    assert fused_qkv_path(x, w, 128) == "pointer"
    monkeypatch.setenv(PATH_ENV, "pointer")
    assert fused_qkv_path(x, w, 128) == "pointer"
    monkeypatch.setenv(PATH_ENV, "cublas")
    with pytest.raises(ValueError, match=f"{PATH_ENV}='cublas'.*auto, pointer, tma, streamk"):
        fused_qkv_path(x, w, 128)
    if not tma_module.tma_available():
        return
    monkeypatch.setenv(PATH_ENV, " TMA ")
    assert fused_qkv_path(x, w, 128) == "tma"  # the interpreter runs tensor descriptors
    monkeypatch.setenv(PATH_ENV, "streamk")
    assert fused_qkv_path(x, w, 128) == "streamk"
    with pytest.raises(ValueError, match="head dim 128"):
        fused_qkv_path(x, torch.zeros(6 * 64, 64), 64)
    with pytest.raises(ValueError, match="contiguous"):
        fused_qkv_path(torch.zeros(64, 5).T, w, 128)
    with pytest.raises(ValueError, match="16-byte"):
        fused_qkv_path(torch.zeros(5, 58), torch.zeros(6 * 128, 58), 128)  # 232-byte rows
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # compiled Triton on CPU tensors: no TMA
    with pytest.raises(ValueError, match="streamk, but x is on cpu, not a CUDA device"):
        fused_qkv_path(x, w, 128)
    monkeypatch.setenv(PATH_ENV, "auto")
    assert fused_qkv_path(x, w, 128) == "pointer"


# ---- full model geometry (GPU only) ------------------------------------------------------------------------

MODELS = {  # n_heads, n_kv_heads, head_dim, d_model, bias, rope theta
    "llada-8b": (32, 32, 128, 4096, False, 5e5),
    "dream-7b": (28, 4, 128, 3584, True, 1e6),
}


@needs_gpu
@pytest.mark.parametrize("n_tokens", [1, 17, 128, 1000, 4096])
@pytest.mark.parametrize("model", sorted(MODELS))
def test_full_layer_bf16(model, n_tokens, monkeypatch):
    monkeypatch.setenv(PATH_ENV, "pointer")  # the TMA kernel has its own full-layer test below
    n_heads, n_kv_heads, head_dim, d_model, bias, theta = MODELS[model]
    layer = Layer(n_heads, n_kv_heads, head_dim, d_model, bias, torch.bfloat16, theta)
    n_cache_rows = 2 * 4096 + 128
    x, positions, cache_rows = tokens(n_tokens, d_model, torch.bfloat16, n_cache_rows)
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
    while not hasattr(fn, "device_caches"):  # autotuner/heuristics wrappers hold the JITFunction in .fn
        fn = fn.fn
    return sum(len(entry[0]) for entry in fn.device_caches.values())


def assert_token_count_does_not_recompile(kernel):
    n_heads, n_kv_heads, head_dim, d_model, bias, theta = MODELS["dream-7b"]
    layer = Layer(n_heads, n_kv_heads, head_dim, d_model, bias, torch.bfloat16, theta)
    k_cache, v_cache = layer.caches(512)
    counts = []
    for n_tokens in (70, 97, 128, 101):  # one autotune bucket, four token counts
        x, positions, cache_rows = tokens(n_tokens, d_model, torch.bfloat16, 512)
        layer.run(x, positions, cache_rows, k_cache, v_cache, "triton")
        counts.append(compiled_variants(kernel))
    assert counts[0] >= 1 and counts[1:] == counts[:1] * 3, counts


@needs_gpu
def test_token_count_does_not_recompile(monkeypatch):
    from flash_dllm.kernels._fused_qkv_rope_cache_triton import _fused_qkv_rope_cache_kernel

    monkeypatch.setenv(PATH_ENV, "pointer")
    assert_token_count_does_not_recompile(_fused_qkv_rope_cache_kernel)


@needs_hopper
def test_tma_token_count_does_not_recompile(monkeypatch):
    monkeypatch.setenv(PATH_ENV, "tma")
    assert_token_count_does_not_recompile(tma_module._fused_qkv_rope_cache_tma_kernel)


@needs_hopper
@pytest.mark.parametrize("path", ["tma", "streamk"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("n_tokens", [1, 7, 128, 1000, 4096])
@pytest.mark.parametrize("model", sorted(MODELS))
def test_tma_full_layer(model, n_tokens, dtype, path, monkeypatch):
    """Both Hopper schedules at LLaDA-8B (MHA) and Dream-7B (GQA, bias) geometry, NaN-poisoned caches."""
    n_heads, n_kv_heads, head_dim, d_model, bias, theta = MODELS[model]
    layer = Layer(n_heads, n_kv_heads, head_dim, d_model, bias, dtype, theta)
    n_cache_rows = 2 * 4096 + 128
    x, positions, cache_rows = tokens(n_tokens, d_model, dtype, n_cache_rows)
    monkeypatch.setenv(PATH_ENV, path)
    compare(layer, x, positions, cache_rows, n_cache_rows, fill=float("nan"))


@needs_hopper
@pytest.mark.parametrize("config", streamk_module.CUDA_CONFIGS, ids=str)
@pytest.mark.parametrize("model,n_tokens", [("dream-7b", 128), ("dream-7b", 1000), ("llada-8b", 4096)])
def test_streamk_every_cuda_config_is_exact_and_reproducible(model, n_tokens, config, monkeypatch):
    """Each stream-K config the tuner may pick (aligned and balanced tails) matches the reference at full layer
    shapes, and three launches give the same bits: the last contributor of a split tile differs from run to
    run on a GPU, the sum order does not."""
    n_heads, n_kv_heads, head_dim, d_model, bias, theta = MODELS[model]
    layer = Layer(n_heads, n_kv_heads, head_dim, d_model, bias, torch.bfloat16, theta)
    x, positions, cache_rows = tokens(n_tokens, d_model, torch.bfloat16, 2 * 4096)
    monkeypatch.setenv(PATH_ENV, "streamk")
    monkeypatch.setattr(streamk_module, "CUDA_CONFIGS", [config])
    monkeypatch.setattr(streamk_module, "_BEST", {})
    compare(layer, x, positions, cache_rows, 2 * 4096, fill=float("nan"))
    runs = []
    for _ in range(3):
        k_cache, v_cache = layer.caches(2 * 4096)
        runs.append((layer.run(x, positions, cache_rows, k_cache, v_cache, "triton"), k_cache, v_cache))
    for later in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], later))
    assert all(int(arrivals.abs().sum()) == 0 for arrivals in streamk_module._ARRIVALS.values())


@needs_hopper
@pytest.mark.parametrize("n_tokens", [128, 1000])
@pytest.mark.parametrize("model", sorted(MODELS))
def test_auto_path_measures_and_keeps_its_choice(model, n_tokens, monkeypatch):
    """auto times the three kernels on the first call of a problem, then runs the chosen one."""
    n_heads, n_kv_heads, head_dim, d_model, bias, theta = MODELS[model]
    layer = Layer(n_heads, n_kv_heads, head_dim, d_model, bias, torch.bfloat16, theta)
    x, positions, cache_rows = tokens(n_tokens, d_model, torch.bfloat16, 2 * 4096)
    monkeypatch.delenv(PATH_ENV, raising=False)
    monkeypatch.setattr(dispatch, "_MEASURED", {})
    compare(layer, x, positions, cache_rows, 2 * 4096)
    key = dispatch.problem_key(x, layer.w, bias, n_heads)
    assert dispatch._MEASURED[key] in dispatch.AUTO_CANDIDATES
    assert fused_qkv_path(x, layer.w, head_dim, key) == dispatch._MEASURED[key]


def test_auto_path_takes_the_fastest_measured_kernel(monkeypatch):
    """Where TMA could run, auto answers "tma" until measured, then the path that timed fastest for that key
    (timings faked: the choice logic, not the GPU)."""
    monkeypatch.delenv(PATH_ENV, raising=False)
    monkeypatch.setattr(dispatch, "_tma_blocker", lambda x, w, head_dim: None)
    monkeypatch.setattr(dispatch, "interpreting", lambda: False)
    monkeypatch.setattr(dispatch, "_MEASURED", {})
    fake_ms = {"pointer": 3.0, "tma": 2.0, "streamk": 1.0}
    ran = []
    monkeypatch.setattr(dispatch, "gpu_time_ms", lambda fn: fn() or fake_ms[ran[-1]])
    x = torch.zeros(100, 8, dtype=torch.bfloat16)
    w = torch.zeros(36 * 128, 8, dtype=torch.bfloat16)
    key = dispatch.problem_key(x, w, True, 28)
    assert dispatch.fused_qkv_path(x, w, 128, key) == "tma"
    assert dispatch._measure_auto(key, ran.append) == "streamk"
    assert ran == ["pointer", "tma", "streamk"]
    assert dispatch.fused_qkv_path(x, w, 128, key) == "streamk"
    other = dispatch.problem_key(torch.zeros(300, 8, dtype=torch.bfloat16), w, True, 28)  # another bucket
    assert other != key and dispatch.fused_qkv_path(x, w, 128, other) == "tma"
