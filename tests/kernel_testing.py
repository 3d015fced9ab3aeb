"""What the kernel test modules share: where the kernels run, the tolerances, the error measure, and the
fused QKV tests' layers, token batches and kernel-vs-reference check."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported (conftest does the same)

import pytest  # noqa: E402
import torch  # noqa: E402

from flash_dllm.kernels import interpreting  # noqa: E402
from flash_dllm.kernels.fused_qkv_rope_cache import fused_qkv_rope_cache, fused_qkv_rope_cache_reference  # noqa: E402

DEVICE = "cpu" if interpreting() else ("cuda" if torch.cuda.is_available() else None)
needs_triton = pytest.mark.skipif(DEVICE is None, reason="Triton needs TRITON_INTERPRET=1 or a CUDA device")
needs_gpu = pytest.mark.skipif(DEVICE != "cuda", reason="full model shapes run on a CUDA device only")

TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    expected = expected.double()
    return ((actual.double() - expected).norm() / expected.norm().clamp_min(1e-30)).item()


# ---- fused QKV + RoPE + cache write --------------------------------------------------------------------------

MODELS = {  # n_heads, n_kv_heads, head_dim, d_model, bias, rope theta
    "llada-8b": (32, 32, 128, 4096, False, 5e5),
    "dream-7b": (28, 4, 128, 3584, True, 1e6),
}


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
        """The functional dispatcher on this layer."""
        return fused_qkv_rope_cache(x, self.w, self.b, self.cos, self.sin, positions, cache_rows, k_cache, v_cache,
                                    self.n_heads, self.n_kv_heads, backend=backend)

    def call(self, op, x, positions, cache_rows, k_cache, v_cache, **kwargs):
        """A FusedQKVRopeCache op on this layer."""
        return op(x, self.w, self.b, self.cos, self.sin, positions, cache_rows, k_cache, v_cache, **kwargs)


def compare(layer: Layer, x, positions, cache_rows, n_cache_rows: int, fill: float | None = None, run=None):
    """Run kernel and reference on identical, separately owned caches and check every output. run(x, positions,
    cache_rows, k_cache, v_cache) -> q is the kernel (default: the functional dispatcher, triton)."""
    run = run or (lambda *args: layer.run(*args, "triton"))
    k_kernel, v_kernel = layer.caches(n_cache_rows, fill)
    k_ref, v_ref = layer.caches(n_cache_rows, fill)
    k_before, v_before = k_kernel.clone(), v_kernel.clone()
    q_kernel = run(x, positions, cache_rows, k_kernel, v_kernel)
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


def same_bits(*pairs) -> bool:
    """Every (a, b) pair bit-identical (NaN included)."""
    return all(a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in pairs)
