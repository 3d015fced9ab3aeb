"""The fused gate/up projection + SwiGLU activation (kernels/gate_up_silu.py) against the unfused pipeline.

Runs the Triton kernel through the CPU interpreter (TRITON_INTERPRET=1) at small odd shapes, or compiled on a
CUDA machine, where the full LLaDA-8B / Dream-7B MLPs and a CUDA-graph replay run too. What "exact" means: with
inputs whose products and sums are exact in fp32 (small integers over powers of two), gate and up are the same
numbers in any summation order, so the activation must be silu_mul's of the unfused product: bit for bit on
CUDA, within the interpreter's exp (SILU_ULPS) on the CPU. With random inputs it matches to fp32 accumulation
order, then one rounding.
"""
from kernel_testing import DEVICE, needs_gpu, needs_triton  # noqa: F401  (sets TRITON_INTERPRET first)
from kernel_testing import bits_equal, check_silu_mul  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from flash_dllm.kernels import _gate_up_select as select  # noqa: E402
from flash_dllm.kernels._gate_up_silu_triton import GateUpConfig, default_configs  # noqa: E402
from flash_dllm.kernels._tuning_store import TuningStore  # noqa: E402
from flash_dllm.kernels.gate_up_silu import GateUpSilu, gate_up_silu, gate_up_silu_reference  # noqa: E402

pytestmark = needs_triton

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
ON_GPU = DEVICE == "cuda"


def min_exact(dtype) -> float:
    """Bit-exact share required: all on CUDA (libdevice's expf is torch's); in the interpreter numpy's exp moves
    silu by an ulp now and then, which fp32 keeps and a 16-bit rounding mostly hides (as in silu_mul's tests)."""
    return 1.0 if ON_GPU else 0.9 if dtype == torch.float32 else 0.99


def exact_inputs(m, f, k, dtype, seed=0, transposed=False):
    """x and a stacked [gate; up] weight of small integers over powers of two: every product and partial sum is
    exact in fp32, so any summation order gives the same gate and up."""
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randint(-4, 5, (m, k), generator=gen) / 4).to(DEVICE, dtype)
    w = (torch.randint(-4, 5, (2 * f, k), generator=gen) / 16).to(DEVICE, dtype)
    return x, (w.t().contiguous().t() if transposed else w)


def random_inputs(m, f, k, dtype, seed=0, transposed=False):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen).to(DEVICE, dtype)
    w = (torch.randn(2 * f, k, generator=gen) / k ** 0.5).to(DEVICE, dtype)
    return x, (w.t().contiguous().t() if transposed else w)


def unfused_product(x, w):
    """gate|up as the unfused pipeline stores them (exact inputs: the fp32 product is exact, then one rounding)."""
    return F.linear(x.float(), w.float()).to(x.dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("transposed", [False, True], ids=["rows", "kn-storage"])
@pytest.mark.parametrize("tma", [False, True], ids=["pointers", "tma"])
@pytest.mark.parametrize("m,f,k,block_n,block_k", [(1, 24, 64, 16, 32), (5, 40, 100, 16, 32), (17, 64, 96, 32, 64),
                                                   (33, 48, 48, 32, 16)])
def test_activation_is_silu_mul_of_the_unfused_product(m, f, k, block_n, block_k, tma, transposed, dtype):
    """Odd row counts, F not a multiple of the tile (the last gate tile reaches into the up rows, never stored), K
    not a multiple of block_k, both weight storages and both load paths."""
    x, w = exact_inputs(m, f, k, dtype, seed=m * 31 + f, transposed=transposed)
    if tma and max(w.stride()) * w.element_size() % 16:
        pytest.skip("a tensor descriptor needs 16-byte aligned rows (the selector reads such a weight by pointers)")
    config = GateUpConfig(max(16, 1 << (m - 1).bit_length()), block_n, block_k, 2, 4, tma)
    act = gate_up_silu(x, w, backend="triton", config=config)
    assert act.shape == (m, f) and act.dtype == dtype
    check_silu_mul(unfused_product(x, w), act, min_exact(dtype))


def test_a_kernel_that_forgot_a_rounding_would_fail():
    """The exactness check has teeth: activation of gate/up not rounded to bf16 first is not accepted."""
    x, w = exact_inputs(17, 64, 96, torch.bfloat16, seed=3)
    x = x * 1.03  # sums no longer land on bf16 values, so skipping the rounding of gate/up shows
    gate, up = F.linear(x.float(), w.float()).chunk(2, dim=-1)
    unrounded = (F.silu(gate) * up).to(torch.bfloat16)
    with pytest.raises(AssertionError):
        check_silu_mul(unfused_product(x, w), unrounded, min_exact=0.99)
    act = gate_up_silu(x, w, backend="triton", config=GateUpConfig(32, 32, 32, 2, 4, False))
    fused = F.linear(x.float(), w.float())  # fp32 sums in another order than the kernel's: compare loosely
    assert (act.float() - gate_up_silu_reference(x, w).float()).abs().max() <= 2e-2 * fused.abs().max()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_random_inputs_match_the_reference_to_accumulation_order(dtype):
    x, w = random_inputs(48, 72, 160, dtype, seed=4, transposed=True)
    act = gate_up_silu(x, w, backend="triton", config=GateUpConfig(64, 32, 32, 2, 4, True))
    expected = gate_up_silu_reference(x, w).float()
    assert (act.float() - expected).abs().max() <= {torch.float32: 1e-5}.get(dtype, 2e-2) * expected.abs().max()
    if dtype != torch.float32:  # fp32 keeps the summation order's last bits; 16-bit rounding mostly hides them
        assert bits_equal(act, expected.to(dtype)).float().mean() >= 0.9


def test_a_weight_a_descriptor_cannot_address_is_read_by_pointers():
    x, w = exact_inputs(5, 40, 100, torch.bfloat16, seed=11)  # rows of 200 bytes: not 16-byte aligned
    launcher = select._bind(GateUpConfig(16, 16, 32, 2, 4, True), x, w)
    assert launcher.config.tma is False
    check_silu_mul(unfused_product(x, w), launcher(x, w), min_exact(torch.bfloat16))


def test_the_dispatcher_checks_the_contract():
    x, w = random_inputs(4, 16, 32, torch.bfloat16)
    with pytest.raises(ValueError, match="2F"):
        gate_up_silu(x, w[:31])
    with pytest.raises(ValueError, match="x's dtype"):
        gate_up_silu(x, w.float())
    with pytest.raises(ValueError, match="x must be"):
        gate_up_silu(x.t(), w)
    assert bits_equal(gate_up_silu(x, w), gate_up_silu_reference(x, w)).all()


def test_default_configs_fit_and_differ():
    for rows in (16, 32, 48, 128, 256):
        configs = default_configs(rows, tma=True)
        assert configs and all(c.shared_memory() <= 200 * 1024 and c.block_m >= rows for c in configs)
        assert len(set(configs)) == len(configs)


def test_op_is_cublas_then_the_activation_unless_told():
    x, w = exact_inputs(48, 64, 128, torch.bfloat16, seed=5, transposed=True)
    op = GateUpSilu("triton")
    out = op(x, w)
    if ON_GPU:  # timed: either path may win, and either gives the activation of the product
        assert op.bound_choice(x, w) == select.CUBLAS or isinstance(op.bound_choice(x, w), GateUpConfig)
        check_silu_mul(unfused_product(x, w), out, min_exact(torch.bfloat16))
    else:  # the interpreter cannot time: the unfused pipeline, the same bits as before this op existed
        assert bits_equal(out, op.silu_mul(F.linear(x, w))).all() and op.bound_choice(x, w) == select.CUBLAS
    config = GateUpConfig(64, 32, 32, 2, 4, True)
    with select.forced_gate_up_silu(config):
        fused = op(x, w)
        assert op.bound_choice(x, w) == config
    assert op.bound_choice(x, w) is None  # the forcing ended: the next call binds again
    check_silu_mul(unfused_product(x, w), fused, min_exact(torch.bfloat16))
    torch_op = GateUpSilu("torch")
    assert bits_equal(torch_op(x, w), gate_up_silu_reference(x, w)).all()


def test_selector_times_both_paths_keeps_the_fastest_and_stores_it(tmp_path):
    x, w = exact_inputs(32, 64, 128, torch.bfloat16, seed=6)
    fast, slow = GateUpConfig(32, 32, 32, 2, 4, False), GateUpConfig(32, 16, 64, 2, 4, False)
    calls = []

    def measure(fn):  # a fake clock over the candidates in order: cuBLAS 3, fast 1, slow 2
        fn()
        calls.append(fn)
        return (3.0, 1.0, 2.0)[len(calls) - 1]

    store = TuningStore(tmp_path)
    op = GateUpSilu("triton")
    with select.forced_gate_up_silu(candidates=(select.CUBLAS, fast, slow), measure=measure, store=store):
        op(x, w)
        assert op.bound_choice(x, w) == fast and len(calls) == 3
    assert list(tmp_path.glob("gate_up_silu-*.json"))
    read_before = select.COUNTERS.stored_choices_read
    select.FAMILY.choices.clear()
    again = GateUpSilu("triton")
    with select.forced_gate_up_silu(candidates=(select.CUBLAS, fast, slow), measure=measure, store=store):
        again(x, w)  # read back from the store: nothing timed
        assert again.bound_choice(x, w) == fast
    assert len(calls) == 3 and select.COUNTERS.stored_choices_read == read_before + 1


def test_selector_drops_a_config_that_computes_wrong(monkeypatch):
    x, w = exact_inputs(32, 64, 128, torch.bfloat16, seed=9)
    wrong, right = GateUpConfig(32, 32, 32, 2, 4, False), GateUpConfig(32, 16, 32, 2, 4, False)

    class Miscomputing(select.GateUpLauncher):
        def __call__(self, x, weight, out=None):
            act = super().__call__(x, weight, out)
            return act * 1.1 if self.config == wrong else act

    monkeypatch.setattr(select, "GateUpLauncher", Miscomputing)
    clock = iter([3.0, 2.0])  # cuBLAS, right: the wrong one (never timed) would have been "fastest" otherwise
    op = GateUpSilu("triton")
    with pytest.warns(UserWarning, match="disagrees with cuBLAS"):
        with select.forced_gate_up_silu(candidates=(select.CUBLAS, wrong, right), measure=lambda fn: next(clock)):
            op(x, w)
            assert op.bound_choice(x, w) == right


def test_projection_request_turns_the_fused_kernel_off(monkeypatch):
    x, w = exact_inputs(16, 64, 128, torch.bfloat16, seed=10)
    monkeypatch.setenv("FLASH_DLLM_PROJECTIONS", "cublas")
    op = GateUpSilu("triton")
    timed = []
    with select.forced_gate_up_silu(measure=lambda fn: timed.append(fn) or 1.0):
        op(x, w)
        assert op.bound_choice(x, w) == select.CUBLAS and not timed
    monkeypatch.setenv("FLASH_DLLM_PROJECTIONS", "auto")
    with select.forced_gate_up_silu(measure=lambda fn: timed.append(fn) or 1.0):
        GateUpSilu("triton")(x, w)
        assert len(timed) == 1 + len(default_configs(16, tma=True))  # cuBLAS and every config (then all tie)


@needs_gpu
@pytest.mark.parametrize("rows", [16, 32, 48, 128, 144])
@pytest.mark.parametrize("model,f,k", [("llada-8b", 12288, 4096), ("dream-7b", 18944, 3584)])
def test_full_geometry_every_default_config_matches_the_unfused_pipeline(model, f, k, rows):
    for transposed in (False, True):
        x, w = random_inputs(rows, f, k, torch.bfloat16, seed=rows, transposed=transposed)
        expected = gate_up_silu_reference(x, w).float()
        for config in default_configs(rows, tma=torch.cuda.get_device_capability()[0] >= 9):
            act = gate_up_silu(x, w, backend="triton", config=config)
            assert (act.float() - expected).abs().max() <= 2e-2 * expected.abs().max(), (config, transposed)
            assert bits_equal(act, expected.to(act.dtype)).float().mean() >= 0.95, (config, transposed)


@needs_gpu
def test_cuda_graph_replay_of_each_path_equals_eager():
    x, w = random_inputs(128, 12288, 4096, torch.bfloat16, seed=8, transposed=True)
    op = GateUpSilu("triton")
    for choice in (select.CUBLAS, default_configs(128, tma=True)[0]):
        with select.forced_gate_up_silu(choice):
            eager = op(x, w).clone()  # binds outside the capture
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = op(x, w)
            graph.replay()
            torch.cuda.synchronize()
            assert bits_equal(out, eager).all(), choice
