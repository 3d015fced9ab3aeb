"""Every Triton kernel of the project compiled for the GPUs it claims, on a machine without one.

The interpreter runs kernels as Python, so what only the compiler sees (types, layouts, shared memory over the
limit, TMA on a GPU without it) would otherwise show up only on the GPU machine, and the RTX 3090 (sm_86, ~100
KB of shared memory per block: the users' card) would never be tested at all. Here the real launchers run on
meta tensors at the LLaDA-8B and Dream-7B shapes (128 and 4096 tokens, bf16) under `compiling_for_gpu`, so the
kernels compile with the launch constants those launchers choose, through Triton's bundled ptxas, for sm_90
(H200) and sm_86. Where a launcher leaves the choice to a tuner (the fused QKV paths' candidate configs, the
attention autotuner), every candidate the tuner would try compiles and at least one fits in shared memory.

The fused QKV selector is asked which paths run on each capability, so sm_86 compiles exactly the paths it
would run there (the pointer kernel; the TMA and stream-K kernels need sm_90).
The MoE kernels are compiled the same way in test_kernel_moe_experts.py. MoE aside, all of it is one
subprocess per capability (TRITON_INTERPRET=0: the launch constants are fixed at import).
"""
from kernel_testing import DEVICE, MODELS, compile_failures, compile_in_subprocesses, compiling_for_gpu

import functools  # noqa: E402
from unittest import mock  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

pytestmark = pytest.mark.skipif(DEVICE == "cuda", reason="the GPU tests compile and run the kernels themselves")

CAPABILITIES = (90, 86)  # H200; RTX 3090
SM_COUNT = {90: 132, 86: 82}  # what the split-KV and stream-K schedules size their grids by
TOKEN_COUNTS = (128, 4096)
MLP_WIDTH = {"llada-8b": 12288, "dream-7b": 18944}  # intermediate_size of each model's config.json
FAMILIES = ("fused_qkv", "scheduled_attention", "add_rms_norm", "silu_mul", "canvas_commit",
            "threshold_select", "greedy_predict", "split_k_linear", "gate_up_silu", "pack_queries",
            "flash_cache_plan", "rank_attended", "block_schedule", "verify_batch")
# the rows of the projections the selectors may run as our kernels: a fast-dllm block and LLaDA's verify pass (32),
# Dream's verify pass (40; 48 is in its bucket), a flash-cache step (128)
SPLIT_K_ROWS = (32, 48, 128)


def meta(*shape, dtype=torch.bfloat16) -> torch.Tensor:
    """A tensor with shape, dtype and strides but no memory: what a launcher needs to pick and compile."""
    return torch.empty(*shape, dtype=dtype, device="meta")


class _ReportsCuda(torch.Tensor):
    """A meta tensor that says it lives on cuda:0, so the fused QKV selector can be asked about a GPU."""

    is_cuda = True
    device = torch.device("cuda", 0)


def fused_qkv_paths_on(capability: int) -> tuple[str, ...]:
    """The paths the fused QKV selector lets auto run on an sm_<capability> GPU (bf16, LLaDA-8B's layer)."""
    from flash_dllm.kernels import _fused_qkv_select as select

    n_heads, n_kv_heads, head_dim, d_model, _, _ = MODELS["llada-8b"]
    x = meta(128, d_model).as_subclass(_ReportsCuda)
    w_qkv = meta((n_heads + 2 * n_kv_heads) * head_dim, d_model).as_subclass(_ReportsCuda)
    with mock.patch.object(select, "_compute_capability", lambda index: divmod(capability, 10)):
        return select.fused_qkv_paths("auto", x, w_qkv, head_dim, interpreter=False)


def compile_fused_qkv(log, capability: int) -> None:
    from flash_dllm.kernels import _fused_qkv_cublas, _fused_qkv_pointer, _fused_qkv_streamk, _fused_qkv_tma
    from flash_dllm.kernels._fused_qkv_common import FusedQKVProblem, m_bucket

    modules = {"pointer": _fused_qkv_pointer, "tma": _fused_qkv_tma, "streamk": _fused_qkv_streamk,
               "cublas": _fused_qkv_cublas}
    launchers = {"pointer": lambda config, problem, x, w: _fused_qkv_pointer.PointerLauncher(config, problem),
                 "tma": _fused_qkv_tma.TMALauncher, "streamk": _fused_qkv_streamk.StreamKLauncher,
                 "cublas": lambda config, problem, x, w: _fused_qkv_cublas.CublasLauncher(config, problem)}
    paths = fused_qkv_paths_on(capability)
    for model, (n_heads, n_kv_heads, head_dim, d_model, bias, _) in MODELS.items():
        n_qkv = (n_heads + 2 * n_kv_heads) * head_dim
        w_qkv, b_qkv = meta(n_qkv, d_model), meta(n_qkv) if bias else None
        cos = sin = meta(4608, head_dim // 2, dtype=torch.float32)
        for n_tokens in TOKEN_COUNTS:
            x, q = meta(n_tokens, d_model), meta(n_tokens, n_heads * head_dim)
            positions = cache_rows = meta(n_tokens, dtype=torch.int64)
            k_cache = v_cache = meta(2 * n_tokens, n_kv_heads * head_dim)
            problem = FusedQKVProblem(n_tokens, d_model, n_heads, n_kv_heads, head_dim, torch.bfloat16, bias,
                                      torch.device("meta"))
            for path in paths:
                log.choice = f"fused_qkv {path} {model} {n_tokens} tokens"
                for config in modules[path].default_configs(m_bucket(n_tokens)):
                    launcher = launchers[path](config, problem, x, w_qkv)
                    launcher(x, w_qkv, b_qkv, cos, sin, positions, cache_rows, q, k_cache, v_cache)


def compile_scheduled_attention(log, capability: int) -> None:
    """The engine's tile height with the feature sets the engine launches:
    plain, attention mass (Flash-Cache), kept keys + in-query keys (Flash-Verify);
    128 tokens over a 4096-key context split the keys (two kernels), 4096 tokens fill the GPU in one pass."""
    from flash_dllm.engine.packing import ATTENTION_BLOCK_M
    from flash_dllm.kernels._scheduled_attention_launcher import TritonScheduledAttention
    from flash_dllm.kernels.scheduled_attention import build_plan

    context = 4096
    for model, (n_heads, n_kv_heads, head_dim, _, _, _) in MODELS.items():
        op = TritonScheduledAttention(n_heads, n_kv_heads, head_dim, n_sms=SM_COUNT[capability])
        for n_tokens in TOKEN_COUNTS:
            rows = context + n_tokens  # the sequence's cache keys, then its in-query keys
            q, k_cache, v_cache = meta(n_tokens, n_heads * head_dim), *(meta(rows, n_kv_heads * head_dim),) * 2
            score = dict(score_query=meta(n_tokens, dtype=torch.bool))
            features = {"plain": {}, "score": score,
                        "keep+inq": dict(kv_keep=meta(rows, dtype=torch.bool), inq_starts=[context],
                                         inq_mask=meta(n_tokens, n_tokens, dtype=torch.bool))}
            for name, extra in features.items():
                plan = build_plan([n_tokens], [0], [context], "meta", block_m=ATTENTION_BLOCK_M, **extra)
                splits = op.bucket(q, plan, meta(rows, dtype=torch.float32)).n_splits
                log.choice = f"scheduled_attention {name} {model} {n_tokens} tokens ({splits} splits)"
                op(q, k_cache, v_cache, plan, meta(rows, dtype=torch.float32) if name == "score" else None)


def compile_small_ops(log, capability: int) -> None:
    from flash_dllm.kernels._add_rms_norm_triton import add_rms_norm_triton
    from flash_dllm.kernels._silu_mul_triton import silu_mul_triton

    for model, (_, _, _, d_model, _, _) in MODELS.items():
        for n_tokens in TOKEN_COUNTS:
            residual, weight = meta(n_tokens, d_model), meta(d_model)
            log.choice = f"add_rms_norm {model} {n_tokens} tokens"
            add_rms_norm_triton(residual, meta(n_tokens, d_model), weight, 1e-6)
            add_rms_norm_triton(residual, None, weight, 1e-6)  # the first layer's norm: no update to add
            # the final norm, over the 16 window rows the LM head reads
            add_rms_norm_triton(residual, meta(n_tokens, d_model), weight, 1e-6, rows=meta(16, dtype=torch.int64))
            # a split-K projection's partials as the update, in place and into the final norm's rows
            parts = meta(2, n_tokens, d_model, dtype=torch.float32)
            add_rms_norm_triton(residual, parts, weight, 1e-6, None, True)
            add_rms_norm_triton(residual, parts, weight, 1e-6, rows=meta(16, dtype=torch.int64))
            log.choice = f"silu_mul {model} {n_tokens} tokens"
            silu_mul_triton(meta(n_tokens, 2 * MLP_WIDTH[model]))


def compile_step_kernels(log, capability: int) -> None:
    """The decode step's commit, threshold select, greedy predictions, plans and Flash-Verify's bookkeeping at a
    chat's shapes (the model only names the choice, and Dream's shift: these kernels have no model dimension):
    16 window candidates over a 512-cell answer and LLaDA's vocabulary, at batch 1 and 32."""
    from flash_dllm.kernels._block_schedule_triton import block_advance_triton, fast_dllm_plan_triton
    from flash_dllm.kernels._canvas_commit_triton import canvas_commit_triton
    from flash_dllm.kernels._flash_cache_plan_triton import flash_cache_plan_triton
    from flash_dllm.kernels.flash_cache_plan import PlanShape
    from flash_dllm.kernels._greedy_predict_triton import greedy_predict_triton
    from flash_dllm.kernels._pack_queries_triton import pack_queries_triton
    from flash_dllm.kernels._rank_attended_triton import rank_attended_triton
    from flash_dllm.kernels._threshold_select_triton import threshold_select_triton
    from flash_dllm.kernels._verify_batch_triton import (verify_accept_triton, verify_pack_triton,
                                                         verify_pick_triton)
    from flash_dllm.kernels.block_schedule import BlockCursors, BlockShape
    from flash_dllm.kernels.pack_queries import PackConstants
    from flash_dllm.kernels.verify_batch import VerifyBatch, VerifyCounters, VerifyShape

    for model in MODELS:
        for n_tokens in TOKEN_COUNTS:
            S = 1 if n_tokens == 128 else 32
            log.choice = f"canvas_commit {model} {n_tokens} tokens"
            canvas_commit_triton(
                _ints(S, 512), meta(S, 512, dtype=torch.float64), _ints(S, 512), _ints(S), _ints(S, 1401),
                _ints(S, 16), _ints(S, 16), meta(S, 16, dtype=torch.float64), _flags(S, 16), _ints(S),
                _flags(S), _flags(S), _ints(S), _ints(S), _ints(S), _ints(S), _ints(2), 126336, 126081, 1 << 40)
            log.choice = f"threshold_select {model} {n_tokens} tokens"
            doubles = meta(S, 16, dtype=torch.float64)
            threshold_select_triton(_ints(S, 16), doubles, _ints(S, 16), _ints(S, 16), doubles,
                                    meta(S, dtype=torch.float64), 126336)
            log.choice = f"greedy_predict {model} {n_tokens} tokens"  # the window's logits; LLaDA's vocabulary
            greedy_predict_triton(meta(16 * S, 126464), 126336, _ints(16 * S))
            log.choice = f"pack_queries {model} {n_tokens} tokens"  # a flash-cache step: 128 rows of 1,400
            constants = PackConstants(126336, 0, shift=model == "dream-7b")
            pack_queries_triton(_flags(S, 1400), _ints(S, 1401), _ints(S), _ints(S), _ints(S), _ints(S, 16),
                                _flags(S, 1400), None, _ints(S), _ints(S), 128 * S, constants)
            log.choice = f"flash_cache_plan {model} {n_tokens} tokens"  # window 16, look-ahead 48, track 64
            shape = PlanShape(16, 48, 64, shift=model == "dream-7b", slot_len=1400)
            flash_cache_plan_triton(_ints(S, 512), _ints(S, 512), _ints(S, 64), _ints(S), _ints(S), _ints(S),
                                    _flags(S), _ints(S), _ints(S), _flags(S), shape)
            log.choice = f"rank_attended {model} {n_tokens} tokens"  # 64 tracked of 1,400 positions
            rank_attended_triton(meta(1400 * S, dtype=torch.float32), _ints(S), _ints(S), _ints(S), _ints(S, 512),
                                 _flags(S), _ints(S, 64), 1400)
            log.choice = f"block_schedule {model} {n_tokens} tokens"  # fast-dllm's blocks of 32, both cache modes
            cursors = BlockCursors(_ints(S), _ints(S), _ints(S))
            for mode in ("dual", "prefix"):
                block_shape = BlockShape(32, slot_len=1401, shift=model == "dream-7b", mode=mode)
                fast_dllm_plan_triton(_ints(S, 512), _ints(S), _ints(S), _ints(S), _flags(S), _ints(S), _ints(S),
                                      _flags(S), cursors, block_shape)
            advance = (_ints(S, 512), _ints(S), _ints(S), _flags(S), _ints(S), _ints(S), _flags(S), cursors,
                       block_shape)
            block_advance_triton(*advance)  # a step's end
            block_advance_triton(*advance, restart=_flags(S))  # a call's start, a slot's admission
            log.choice = f"verify_batch {model} {n_tokens} tokens"  # Flash-Verify: window 16, cap 8
            shift = model == "dream-7b"
            verify_shape = VerifyShape(cap=8, shift=shift, mask_id=126336, trash_row=0, slot_len=1400)
            verify_pick_triton(_ints(S, 512), _ints(S, 512), _ints(S), _ints(S), _flags(S), _ints(S), _ints(S),
                               _flags(S), _ints(S, 16), _ints(S, 16), meta(S, 16, dtype=torch.float64), verify_shape)
            batch = VerifyBatch(tracked=_ints(S, 16), cells=_ints(S, 8), drafts=_ints(S, 8))
            rows = 16 + (3 if shift else 2) * 8
            verify_pack_triton(batch, _ints(S, 512), _ints(S, 1401), _ints(S), _ints(S), _ints(S),
                               _flags(rows, rows), meta(1 + 1400 * S, dtype=torch.int8), verify_shape)
            counters = VerifyCounters(_ints(S), _ints(S), _ints(S), _ints(S))
            for rule in ("paper", "cumulative"):
                doubles = meta(8 * S, dtype=torch.float64)
                verify_accept_triton(batch, _ints(8 * S), doubles, doubles, meta(S, dtype=torch.float64), _flags(S),
                                     counters, rule)


def compile_split_k_linear(log, capability: int) -> None:
    """Every config the projection selector would time, for the output and down projections; TMA weight loads
    on sm_90, pointer loads below (the selector reads weights through pointers where TMA is missing)."""
    from flash_dllm.kernels._split_k_linear_triton import SplitKLauncher, default_configs

    for model, (_, _, _, d_model, _, _) in MODELS.items():
        for rows in SPLIT_K_ROWS:
            log.choice = f"split_k_linear {model} {rows} rows"
            for d_in in (d_model, MLP_WIDTH[model]):
                x, weight = meta(rows, d_in), meta(d_model, d_in)
                for config in default_configs(rows, tma=capability >= 90):
                    SplitKLauncher(config, x, weight)(x, weight)


def compile_gate_up_silu(log, capability: int) -> None:
    """Every config the gate/up selector would time, on the weight layout the engine keeps there ([K, 2F]
    storage read through TMA on sm_90, rows through pointers below)."""
    from flash_dllm.kernels._gate_up_silu_triton import GateUpLauncher, default_configs

    hopper = capability >= 90
    for model, (_, _, _, d_model, _, _) in MODELS.items():
        for rows in SPLIT_K_ROWS:
            log.choice = f"gate_up_silu {model} {rows} rows"
            x = meta(rows, d_model)
            weight = meta(d_model, 2 * MLP_WIDTH[model]).t() if hopper else meta(2 * MLP_WIDTH[model], d_model)
            for config in default_configs(rows, tma=hopper):
                GateUpLauncher(config, x, weight)(x, weight)


def _ints(*shape):
    return meta(*shape, dtype=torch.int64)


def _flags(*shape):
    return meta(*shape, dtype=torch.bool)


def compile_for_gpu(capability: int):
    """Every kernel but MoE's, for an sm_<capability> GPU (run with TRITON_INTERPRET=0): the CompileLog."""
    from flash_dllm.kernels import _fused_qkv_streamk

    with compiling_for_gpu(capability) as log, \
            mock.patch.object(_fused_qkv_streamk, "n_programs_for", lambda device: SM_COUNT[capability]):
        compile_fused_qkv(log, capability)
        compile_scheduled_attention(log, capability)
        compile_small_ops(log, capability)
        compile_step_kernels(log, capability)
        compile_split_k_linear(log, capability)
        compile_gate_up_silu(log, capability)
    return log


@functools.lru_cache(maxsize=None)
def compiled() -> dict:
    """One subprocess per capability, both at once, shared by the tests of every kernel family."""
    pytest.importorskip("triton.backends.nvidia")
    return compile_in_subprocesses("test_kernels_compile", "compile_for_gpu", CAPABILITIES)


def test_fused_qkv_selector_times_the_pointer_kernel_and_cublas_below_sm90():
    assert fused_qkv_paths_on(86) == ("pointer", "cublas")
    assert fused_qkv_paths_on(90) == ("pointer", "tma", "streamk", "cublas")


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("capability", CAPABILITIES)
def test_kernels_compile_for_gpus(capability, family):
    kernels = [k for k in compiled()[capability] if k.choice.startswith(family + " ")]
    failures = compile_failures(kernels, capability)
    assert not failures, "\n".join(failures)
    choices = {k.choice.split(" (")[0] for k in kernels}
    paths = len(fused_qkv_paths_on(capability)) if family == "fused_qkv" else 1
    variants = {"scheduled_attention": 3}.get(family, 1)  # feature sets
    sizes = len(SPLIT_K_ROWS) if family in ("split_k_linear", "gate_up_silu") else len(TOKEN_COUNTS)
    assert len(choices) == paths * variants * len(MODELS) * sizes, sorted(choices)
