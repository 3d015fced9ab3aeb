"""RoPE + KV-cache write of a finished projection (kernels/rope_cache_write.py) against its reference, and the
fused QKV op's "cublas" path built on it (the vendor GEMM, then this kernel) against the fused reference.

Interpreter (TRITON_INTERPRET=1) on the CPU, or compiled on a CUDA device. The kernel reads the projection's
rounded values and rotates them in fp32 as the reference does, so outputs match to the bit wherever the two
round the same fp32 value: V always (a copy), q and k in fp32 and, in 16-bit dtypes, to within one rounding
(compiled code may fuse a multiply-add the reference rounds twice). Cache rows no token names stay untouched."""
from kernel_testing import DEVICE, MODELS, Layer, compare, needs_gpu, needs_triton, same_bits, tokens  # noqa: F401

import pytest  # noqa: E402
import torch  # noqa: E402

from flash_dllm.kernels.fused_qkv_rope_cache import (FusedQKVChoice, FusedQKVRopeCache, forced_fused_qkv,  # noqa: E402
                                                     fused_qkv_choice, fused_qkv_problem_key)
from flash_dllm.kernels._fused_qkv_cublas import CublasConfig  # noqa: E402
from flash_dllm.kernels.rope_cache_write import rope_cache_write, rope_cache_write_reference  # noqa: E402

pytestmark = needs_triton


def projected(layer: Layer, n_tokens: int, n_rows: int, seed: int = 2):
    x, positions, cache_rows = tokens(n_tokens, layer.w.shape[1], layer.dtype, n_rows, seed)
    return torch.nn.functional.linear(x, layer.w, layer.b), positions, cache_rows


def both(layer: Layer, qkv, positions, cache_rows, n_rows: int, fill=float("nan")):
    """(kernel's q, k, v caches), (reference's): caches poisoned with `fill`, so an unnamed row must keep it."""
    out = []
    for backend in ("triton", "torch"):
        k_cache, v_cache = layer.caches(n_rows, fill)
        q = rope_cache_write(qkv, layer.cos, layer.sin, positions, cache_rows, k_cache, v_cache, layer.n_heads,
                             layer.n_kv_heads, backend=backend)
        out.append((q, k_cache, v_cache))
    return out


@pytest.mark.parametrize("n_heads,n_kv_heads,head_dim", [(4, 4, 16), (4, 2, 16), (3, 1, 24), (9, 3, 8), (2, 1, 128)],
                         ids=["mha", "gqa", "half-12", "heads-straddle-blocks", "dh-128"])
@pytest.mark.parametrize("n_tokens", [1, 7, 33])
def test_fp32_equals_the_reference_bit_for_bit(n_heads, n_kv_heads, head_dim, n_tokens):
    layer = Layer(n_heads, n_kv_heads, head_dim=head_dim, d_model=32, bias=True, dtype=torch.float32)
    n_rows = 2 * n_tokens + 5
    qkv, positions, cache_rows = projected(layer, n_tokens, n_rows)
    (q, k, v), (q_ref, k_ref, v_ref) = both(layer, qkv, positions, cache_rows, n_rows)
    if DEVICE != "cuda":  # the interpreter rounds every fp32 product and difference as torch does
        assert same_bits((q, q_ref), (k, k_ref))
    torch.testing.assert_close(q, q_ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(k, k_ref, rtol=1e-6, atol=1e-6, equal_nan=True)
    assert same_bits((v, v_ref))  # NaN-poisoned rows no token names are still NaN on both sides
    assert int(k.isnan().any(1).sum()) == n_rows - n_tokens


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_half_precisions_within_one_rounding(dtype):
    layer = Layer(4, 2, head_dim=32, d_model=64, bias=True, dtype=dtype, theta=1e6)
    qkv, positions, cache_rows = projected(layer, 29, 64)
    (q, k, v), (q_ref, k_ref, v_ref) = both(layer, qkv, positions, cache_rows, 64)
    ulp = {torch.bfloat16: 2 ** -7, torch.float16: 2 ** -10}[dtype]
    torch.testing.assert_close(q.float(), q_ref.float(), rtol=ulp, atol=ulp)
    torch.testing.assert_close(k.float(), k_ref.float(), rtol=ulp, atol=ulp, equal_nan=True)
    assert same_bits((v, v_ref))


def test_rotation_is_applied_to_q_and_k_and_int32_indices_work():
    """Position 0 is the identity: then q and k are the projection's own columns; elsewhere they are not. int32
    positions and rows (what a plan holds) read the same as int64."""
    layer = Layer(2, 2, head_dim=16, d_model=32, bias=False, dtype=torch.float32)
    qkv, positions, cache_rows = projected(layer, 9, 9)
    k_id, v_id = layer.caches(9)
    q_id = rope_cache_write(qkv, layer.cos, layer.sin, torch.zeros_like(positions).int(), cache_rows.int(), k_id,
                            v_id, 2, 2, backend="triton")
    assert torch.equal(q_id, qkv[:, :32]) and torch.equal(k_id[cache_rows], qkv[:, 32:64])
    k_rot, v_rot = layer.caches(9)
    q_rot = rope_cache_write(qkv, layer.cos, layer.sin, positions + 1, cache_rows, k_rot, v_rot, 2, 2,
                             backend="triton")
    assert not torch.allclose(q_rot, q_id) and not torch.allclose(k_rot, k_id) and torch.equal(v_rot, v_id)


@pytest.mark.parametrize("n_tokens", [1, 17])
@pytest.mark.parametrize("bias", [False, True])
def test_the_cublas_path_of_the_fused_op_matches_the_fused_reference(n_tokens, bias):
    layer = Layer(4, 2, head_dim=16, d_model=64, bias=bias, dtype=torch.float32)
    x, positions, cache_rows = tokens(n_tokens, 64, torch.float32, n_cache_rows=2 * n_tokens + 7)
    op = FusedQKVRopeCache("triton", 4, 2)
    with forced_fused_qkv(path="cublas"):
        compare(layer, x, positions, cache_rows, 2 * n_tokens + 7, fill=float("nan"),
                run=lambda *args: layer.call(op, *args))
        bound = FusedQKVChoice("cublas", CublasConfig())
        assert fused_qkv_choice(fused_qkv_problem_key(x, layer.w, bias, 4), "cublas") == bound
        assert op.bound_choice(x, layer.w, layer.b) == bound


def test_the_reference_returns_into_out():
    layer = Layer(3, 1, head_dim=16, d_model=32, bias=True, dtype=torch.float32)
    qkv, positions, cache_rows = projected(layer, 5, 8)
    out = torch.full((5, 48), float("nan"), device=DEVICE)
    k_cache, v_cache = layer.caches(8)
    q = rope_cache_write_reference(qkv, layer.cos, layer.sin, positions, cache_rows, k_cache, v_cache, 3, 1, out=out)
    assert q.data_ptr() == out.data_ptr() and not out.isnan().any()


@needs_gpu
@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize("n_tokens", [128, 256])
def test_full_model_shapes_on_the_gpu(model, n_tokens):
    n_heads, n_kv_heads, head_dim, d_model, bias, theta = MODELS[model]
    layer = Layer(n_heads, n_kv_heads, head_dim=head_dim, d_model=d_model, bias=bias, dtype=torch.bfloat16,
                  theta=theta)
    qkv, positions, cache_rows = projected(layer, n_tokens, 2 * n_tokens)
    (q, k, v), (q_ref, k_ref, v_ref) = both(layer, qkv, positions, cache_rows, 2 * n_tokens)
    torch.testing.assert_close(q.float(), q_ref.float(), rtol=2 ** -7, atol=2 ** -7)
    torch.testing.assert_close(k.float(), k_ref.float(), rtol=2 ** -7, atol=2 ** -7, equal_nan=True)
    assert same_bits((v, v_ref))
