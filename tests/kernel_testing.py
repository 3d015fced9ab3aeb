"""What the kernel test modules share: where the kernels run, the tolerances, the error measure, the fused QKV
tests' layers, token batches and kernel-vs-reference check, and compiling kernels for a GPU without one."""
import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

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


# ---- elementwise bit checks (silu_mul and the fused gate/up activation) ------------------------------------------

SILU_ULPS = 2  # the interpreter's exp and torch CPU's differ by an ulp; 1 + exp and the division can carry that to two


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise bit equality (tells -0 from 0; NaN equals a NaN)."""
    ints = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}[a.dtype]
    return (a.view(ints) == b.view(ints)) | (a.isnan() & b.isnan())


def nudged(x: torch.Tensor, ulps: int) -> torch.Tensor:
    """x moved `ulps` fp32 ulps up (positive) or down."""
    toward = torch.full_like(x, float("inf") if ulps > 0 else float("-inf"))
    for _ in range(abs(ulps)):
        x = torch.nextafter(x, toward)
    return x


def ulp_order(limit: int) -> list[int]:
    return sorted(range(-limit, limit + 1), key=abs)


def check_silu_mul(gate_up: torch.Tensor, act: torch.Tensor, min_exact: float) -> None:
    """act is torch's F.silu(gate) * up of gate_up ([N, 2F]): every element with silu's fp32 value moved by at
    most SILU_ULPS (the interpreter's exp), and at least min_exact of them bit for bit."""
    import torch.nn.functional as F

    gate, up = gate_up.chunk(2, dim=-1)
    exact = bits_equal(act, F.silu(gate) * up)
    silu_fp32 = F.silu(gate.float())
    explained = torch.zeros_like(exact)
    for k in ulp_order(SILU_ULPS):
        explained |= bits_equal(act, (nudged(silu_fp32, k).to(act.dtype).float() * up.float()).to(act.dtype))
    assert explained.all(), f"{(~explained).sum().item()} outputs not explained by silu within {SILU_ULPS} ulp"
    assert exact.float().mean() >= min_exact, f"only {exact.float().mean():.4f} bit-exact"


# ---- compiled for real GPUs, without one ----------------------------------------------------------------------
# The interpreter runs kernels as Python, so errors only the compiler sees (types, layouts, shared memory, TMA on
# a GPU without it) would show up only on a GPU. Under `compiling_for_gpu` the real launchers run on meta tensors
# and every launch compiles its kernel through Triton's bundled ptxas for the named capability instead of running.

# Shared memory one block may use (the opt-in maximum the driver reports): H200, RTX 3090.
SHARED_MEMORY_LIMIT = {90: 232448, 86: 101376}


@dataclasses.dataclass
class CompiledKernel:
    """One kernel compiled (or refused) for a GPU under `compiling_for_gpu`."""

    choice: str  # what the launch was for (`CompileLog.choice` when it ran): a tuner's candidates share one
    kernel: str
    constants: str  # the constexprs and num_warps / num_stages it was compiled with
    shared: int | None  # bytes of shared memory per block; None when it did not compile
    error: str | None = None  # the compiler's message
    seconds: float = 0.0  # compile time (0 when the JIT had compiled the same specialisation already)


@dataclasses.dataclass
class CompileLog:
    choice: str = ""  # set by the caller before each launch it makes
    kernels: list = dataclasses.field(default_factory=list)


class _CompileOnlyDriver:
    """What JITFunction.run asks of Triton's driver, for a GPU that is not there."""

    def __init__(self, capability: int):
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget("cuda", capability, 32)

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        return f"compile-only-sm{self.target.arch}"  # a device key of its own: the JIT caches per device

    def get_current_stream(self, device=None):
        return 0


@contextlib.contextmanager
def compiling_for_gpu(capability: int):
    """Inside the block a Triton launch compiles its kernel for an sm_<capability> GPU and returns without
    running it (an autotuned kernel compiles every config its pruning keeps, as its first GPU call would).
    Yields the CompileLog that collects them. Needs TRITON_INTERPRET=0 at import (see `compile_in_subprocesses`)."""
    from triton.runtime import autotuner, jit
    from triton.runtime.driver import driver

    log = CompileLog()
    jit_run, tune_run = jit.JITFunction.run, autotuner.Autotuner.run

    def compile_only(fn, *args, grid, warmup, **kwargs):
        constants = str(kwargs)
        start = time.perf_counter()
        try:
            kernel = jit_run(fn, *args, grid=grid, warmup=True, **kwargs)
        except Exception as exc:  # the compiler's refusal is the finding: keep it and go on
            log.kernels.append(CompiledKernel(log.choice, fn.__name__, constants, None,
                                              f"{type(exc).__name__}: {exc}"[-2000:], time.perf_counter() - start))
            return None
        log.kernels.append(CompiledKernel(log.choice, fn.__name__, constants, kernel.metadata.shared, None,
                                          time.perf_counter() - start))
        return kernel

    def every_config(tuner, *args, grid=None, warmup=False, **kwargs):
        tuner.nargs = dict(zip(tuner.arg_names, args))
        for config in tuner.prune_configs(kwargs):
            tuner.fn.run(*args, grid=grid, warmup=True, **kwargs, **config.all_kwargs())

    # Triton 3.7 makes its driver lazily behind a property (asking for it here would fail: no GPU); older ones
    # hold a lazy proxy in a plain attribute
    previous_driver = driver._active if hasattr(driver, "_active") else driver.active
    jit.JITFunction.run, autotuner.Autotuner.run = compile_only, every_config
    driver.set_active(_CompileOnlyDriver(capability))
    try:
        yield log
    finally:
        jit.JITFunction.run, autotuner.Autotuner.run = jit_run, tune_run
        driver.set_active(previous_driver)


def compile_in_subprocesses(module: str, function: str, capabilities) -> dict[int, list[CompiledKernel]]:
    """{capability: tests/<module>.<function>(capability).kernels}, each run in a fresh interpreter with
    TRITON_INTERPRET=0 (the kernels' launch constants are fixed at import), all capabilities at once: the
    compiles are single-threaded, so on several cores the wall time is the slowest capability's."""
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    runs = {}
    for capability in capabilities:
        code = (f"import json, dataclasses, {module} as m; log = m.{function}({capability}); "
                "print(json.dumps([dataclasses.asdict(k) for k in log.kernels]))")
        runs[capability] = subprocess.Popen([sys.executable, "-c", code], cwd=Path(__file__).parent, env=env,
                                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    results = {}
    for capability, run in runs.items():
        stdout, stderr = run.communicate(timeout=900)
        assert run.returncode == 0, f"sm_{capability}: {stderr[-3000:]}"
        results[capability] = [CompiledKernel(**k) for k in json.loads(stdout.splitlines()[-1])]
    return results


def compile_failures(kernels: list[CompiledKernel], capability: int) -> list[str]:
    """What is wrong with a compile log: every kernel must compile, and each (choice, kernel) must have at least
    one config that fits the GPU's shared memory (a tuner skips the ones that do not; a fixed launch has one)."""
    failures = [f"{k.choice}: {k.kernel} {k.constants}: {k.error}" for k in kernels if k.error]
    limit = SHARED_MEMORY_LIMIT[capability]
    groups: dict = {}
    for k in kernels:
        if k.error is None:
            groups.setdefault((k.choice, k.kernel), []).append(k)
    for (choice, kernel), tried in groups.items():
        if min(k.shared for k in tried) > limit:
            failures.append(f"{choice}: {kernel}: no config fits {limit} bytes of shared memory "
                            f"({', '.join(f'{k.constants} needs {k.shared}' for k in tried)})")
    return failures
