"""The split-K projection (kernels/split_k_linear.py) and the norm that sums its parts, against plain torch.

Runs the Triton kernels through the CPU interpreter (TRITON_INTERPRET=1) at small odd shapes, or compiled on a
CUDA machine, where the full LLaDA-8B / Dream-7B projections, the selector's timing and a CUDA-graph replay run
too. What "exact" means: each partial is an fp32 sum of exact products in another order than torch's, so parts
match the reference to fp32 accumulation error; the norm's sum of the parts is bit-exact (same order), and so is
everything after it.
"""
from kernel_testing import DEVICE, needs_gpu, needs_triton  # noqa: F401  (sets TRITON_INTERPRET first)

import itertools  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from flash_dllm.kernels import _split_k_select as select  # noqa: E402
from flash_dllm.kernels._split_k_linear_triton import SplitKConfig, default_configs  # noqa: E402
from flash_dllm.kernels._tuning_store import TuningStore  # noqa: E402
from flash_dllm.kernels.add_rms_norm import add_rms_norm, add_rms_norm_reference  # noqa: E402
from flash_dllm.kernels.split_k_linear import (SkinnyLinear, split_k_linear, split_k_linear_reference,  # noqa: E402
                                               split_ranges)

pytestmark = needs_triton

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
EPS = 1e-5


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    ints = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}[a.dtype]
    return bool((a.view(ints) == b.view(ints)).all())


def inputs(m, n, k, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen).to(DEVICE, dtype)
    w = (torch.randn(n, k, generator=gen) / k ** 0.5).to(DEVICE, dtype)
    return x, w


def parts_error(parts: torch.Tensor, expected: torch.Tensor) -> float:
    """Largest error of any partial, relative to the largest partial."""
    return ((parts - expected).abs().max() / expected.abs().max().clamp_min(1e-30)).item()


def test_split_ranges_cut_k_as_the_contract_says():
    assert split_ranges(256, 2, 64) == [(0, 128), (128, 256)]
    assert split_ranges(200, 3, 32) == [(0, 96), (96, 192), (192, 200)]  # ceil(200/3)=67 -> 96
    assert split_ranges(64, 4, 32) == [(0, 32), (32, 64), (64, 64), (64, 64)]  # trailing ranges empty
    for k, s, b in itertools.product([64, 100, 4096], [1, 2, 3, 5], [16, 64]):
        ranges = split_ranges(k, s, b)
        assert ranges[0][0] == 0 and ranges[-1][1] == k
        assert all(a1 == b0 for (_, a1), (b0, _) in zip(ranges, ranges[1:]))
        assert all(a % b == 0 for a, _ in ranges if a < k)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("m,n,k,splits,block_k", [(1, 64, 64, 1, 32), (5, 96, 200, 3, 32), (48, 64, 256, 2, 64),
                                                  (33, 80, 96, 4, 16), (130, 64, 128, 2, 32)])
@pytest.mark.parametrize("tma", [False, True], ids=["pointer", "tma"])
def test_parts_match_the_reference(m, n, k, splits, block_k, tma, dtype):
    x, w = inputs(m, n, k, dtype, seed=m + n + k)
    config = SplitKConfig(min(128, max(16, 1 << (m - 1).bit_length())), 16 if n % 32 else 32, block_k, splits,
                          2, 4, tma)
    parts = split_k_linear(x, w, splits, block_k=block_k, backend="triton", config=config)
    expected = split_k_linear_reference(x, w, splits, block_k)
    assert parts.shape == (splits, m, n) and parts.dtype == torch.float32
    assert parts_error(parts, expected) < 1e-5
    if dtype != torch.float32:  # the parts of a 16-bit product sum to the projection cuBLAS would round
        rounded = parts.sum(0).to(dtype).float()
        assert (rounded - F.linear(x.float(), w.float())).abs().max() <= 2e-2 * rounded.abs().max()


def test_a_wrong_split_is_caught():
    """A mutation check: the reference with another cut must not pass the comparison above."""
    x, w = inputs(17, 64, 256, torch.float32, seed=3)
    parts = split_k_linear(x, w, 2, block_k=64, backend="triton")
    assert parts_error(parts, split_k_linear_reference(x, w, 2, 64)) < 1e-5
    assert parts_error(parts, split_k_linear_reference(x, w, 2, 32 * 3)) > 1e-2


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n_parts,n,d", [(1, 3, 64), (2, 17, 96), (4, 130, 200), (3, 5, 4096)])
def test_norm_sums_parts_in_order_and_rounds_once(n_parts, n, d, dtype):
    gen = torch.Generator().manual_seed(n_parts * 100 + n)
    residual = (torch.randn(n, d, generator=gen) * 4).to(DEVICE, dtype)
    parts = torch.randn(n_parts, n, d, generator=gen).to(DEVICE)
    weight = (torch.rand(d, generator=gen) + 0.5).to(DEVICE, dtype)
    expected_residual, expected_normed = add_rms_norm_reference(residual.clone(), parts, weight, EPS)
    new_residual, normed = add_rms_norm(residual.clone(), parts, weight, EPS, backend="triton")
    assert same_bits(new_residual, expected_residual)
    summed = parts[0].clone()
    for part in parts[1:]:
        summed += part
    assert same_bits(expected_residual, residual + summed.to(dtype))  # the reference is what the contract says
    if n_parts > 1 and dtype != torch.float32:  # rounding each part before the sum would differ somewhere
        early = residual + sum(p.to(dtype) for p in parts)
        assert not same_bits(new_residual, early)
    assert (normed.float() - expected_normed.float()).abs().max() <= 1e-2 * expected_normed.float().abs().max()


@pytest.mark.parametrize("inplace", [False, True])
def test_norm_of_parts_gathers_rows_and_writes_in_place(inplace):
    gen = torch.Generator().manual_seed(11)
    residual = torch.randn(9, 96, generator=gen).to(DEVICE, torch.bfloat16)
    parts = torch.randn(3, 9, 96, generator=gen).to(DEVICE)
    weight = torch.rand(96, generator=gen).to(DEVICE, torch.bfloat16) + 0.5
    expected = add_rms_norm_reference(residual.clone(), parts, weight, EPS)
    if inplace:
        h = residual.clone()
        new_residual, _ = add_rms_norm(h, parts, weight, EPS, inplace=True, backend="triton")
        assert new_residual.data_ptr() == h.data_ptr() and same_bits(h, expected[0])
    else:
        rows = torch.tensor([8, 0, 4, 4], device=DEVICE)
        gathered, normed = add_rms_norm(residual, parts, weight, EPS, rows=rows, backend="triton")
        assert same_bits(gathered, expected[0].index_select(0, rows))
        ref_gathered = add_rms_norm_reference(residual, parts, weight, EPS, rows=rows)
        assert same_bits(gathered, ref_gathered[0]) and same_bits(normed, ref_gathered[1])


def test_contract_violations_are_rejected():
    x, w = inputs(4, 32, 64, torch.bfloat16)
    with pytest.raises(ValueError, match="splits"):
        split_k_linear(x, w, 0)
    with pytest.raises(ValueError, match="weight"):
        split_k_linear(x, w.float(), 2)
    with pytest.raises(ValueError, match="does not cut"):
        split_k_linear(x, w, 2, backend="triton", config=SplitKConfig(16, 32, 64, 3, 2, 4, False))
    residual = torch.zeros(4, 32, device=DEVICE, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="parts"):
        add_rms_norm(residual, torch.zeros(2, 4, 32, device=DEVICE, dtype=torch.bfloat16), torch.ones(32), EPS)
    with pytest.raises(ValueError, match="parts"):
        add_rms_norm(residual, torch.zeros(17, 4, 32, device=DEVICE), torch.ones(32), EPS)


def test_default_configs_fit_shared_memory_and_cover_the_rows():
    for rows in (1, 16, 32, 48, 128, 144, 256):
        configs = default_configs(rows, tma=True)
        assert configs and all(c.shared_memory() <= 200 * 1024 and c.block_m >= rows for c in configs)
        assert len(set(configs)) == len(configs)


def test_skinny_linear_is_cublas_unless_told_and_its_parts_feed_the_norm():
    x, w = inputs(48, 64, 128, torch.bfloat16, seed=5)
    op = SkinnyLinear("triton")
    out = op(x, w)  # the interpreter cannot time: cuBLAS (F.linear), the same bits as before this op existed
    assert same_bits(out, F.linear(x, w)) and op.bound_choice(x, w) == select.CUBLAS
    config = SplitKConfig(64, 32, 32, 2, 2, 4, True)
    with select.forced_skinny_linear(config):
        parts = op(x, w)
        assert op.bound_choice(x, w) == config and parts.shape == (2, 48, 64)
    assert op.bound_choice(x, w) is None  # the forcing ended: the next call binds again
    residual = torch.randn(48, 64).to(DEVICE, torch.bfloat16)
    via_parts = add_rms_norm(residual.clone(), parts, torch.ones(64, device=DEVICE), EPS, backend="triton")[0]
    via_linear = residual + F.linear(x, w)
    assert (via_parts.float() - via_linear.float()).abs().max() <= 2e-2 * via_linear.float().abs().max()
    assert same_bits(SkinnyLinear("torch")(x, w), F.linear(x, w))


def test_selector_times_each_candidate_with_its_norm_and_keeps_the_fastest(tmp_path):
    x, w = inputs(32, 64, 128, torch.bfloat16, seed=6)
    fast = SplitKConfig(32, 32, 32, 2, 2, 4, False)
    slow = SplitKConfig(32, 16, 64, 4, 2, 4, False)
    calls = []

    def measure(fn):  # a fake clock over the candidates in order: cuBLAS 3, fast 1, slow 2
        fn()
        calls.append(fn)
        return (3.0, 1.0, 2.0)[len(calls) - 1]

    store = TuningStore(tmp_path)
    op = SkinnyLinear("triton")
    with select.forced_skinny_linear(candidates=(select.CUBLAS, fast, slow), measure=measure, store=store):
        op(x, w)
        assert op.bound_choice(x, w) == fast and len(calls) == 3
    assert list(tmp_path.glob("skinny_linear-*.json"))
    read_before = select.COUNTERS.stored_choices_read
    select._CHOICES.clear()
    again = SkinnyLinear("triton")
    with select.forced_skinny_linear(candidates=(select.CUBLAS, fast, slow), measure=measure, store=store):
        again(x, w)  # read back from the store: nothing timed
        assert again.bound_choice(x, w) == fast
    assert len(calls) == 3 and select.COUNTERS.stored_choices_read == read_before + 1


@needs_gpu
def test_the_first_call_of_a_problem_is_never_inside_a_capture():
    x, w = inputs(128, 256, 512, torch.bfloat16, seed=7)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="call the op once eagerly"):
        with torch.cuda.graph(graph):
            SkinnyLinear("triton")(x, w)


@needs_gpu
@pytest.mark.parametrize("rows", [32, 48, 128, 144])
@pytest.mark.parametrize("model,n,k", [("llada-8b-o", 4096, 4096), ("llada-8b-down", 4096, 12288),
                                       ("dream-7b-down", 3584, 18944)])
def test_full_geometry_every_default_config_matches_torch(model, n, k, rows):
    x, w = inputs(rows, n, k, torch.bfloat16, seed=rows)
    expected = F.linear(x.float(), w.float())
    for config in default_configs(rows, tma=torch.cuda.get_device_capability()[0] >= 9):
        parts = split_k_linear(x, w, config.splits, block_k=config.block_k, backend="triton", config=config)
        assert (parts.sum(0) - expected).abs().max() <= 1e-3 * expected.abs().max(), config


@needs_gpu
def test_cuda_graph_replay_of_the_chosen_projection_and_norm_equals_eager():
    n, k, rows = 4096, 12288, 128
    x, w = inputs(rows, n, k, torch.bfloat16, seed=8)
    op = SkinnyLinear("triton")
    h = torch.randn(rows, n, device=DEVICE, dtype=torch.bfloat16)
    gain = torch.ones(n, device=DEVICE, dtype=torch.bfloat16)
    normed = torch.empty_like(h)
    from flash_dllm.kernels.add_rms_norm import AddRMSNorm
    norm = AddRMSNorm("triton")
    for choice in (select.CUBLAS, default_configs(rows, tma=True)[0]):
        with select.forced_skinny_linear(choice):
            start = h.clone()
            norm(h, op(x, w), gain, EPS, out=normed, inplace=True)  # binds outside the capture
            eager_h, eager_normed = h.clone(), normed.clone()
            graph = torch.cuda.CUDAGraph()
            h.copy_(start)
            with torch.cuda.graph(graph):
                norm(h, op(x, w), gain, EPS, out=normed, inplace=True)
            h.copy_(start)
            graph.replay()
            torch.cuda.synchronize()
            assert same_bits(h, eager_h) and same_bits(normed, eager_normed), choice


def test_selector_drops_a_config_whose_parts_disagree_with_cublas(monkeypatch):
    x, w = inputs(32, 64, 128, torch.bfloat16, seed=9)
    wrong = SplitKConfig(32, 32, 32, 2, 2, 4, False)
    right = SplitKConfig(32, 16, 32, 4, 2, 4, False)

    class Miscomputing(select.SplitKLauncher):
        def __call__(self, x, weight, out=None):
            parts = super().__call__(x, weight, out)
            return parts * 1.1 if self.config == wrong else parts

    monkeypatch.setattr(select, "SplitKLauncher", Miscomputing)
    clock = iter([3.0, 2.0])  # cuBLAS, right: the wrong one (never timed) would have been "fastest" otherwise
    op = SkinnyLinear("triton")
    with pytest.warns(UserWarning, match="disagrees with cuBLAS"):
        with select.forced_skinny_linear(candidates=(select.CUBLAS, wrong, right), measure=lambda fn: next(clock)):
            op(x, w)
            assert op.bound_choice(x, w) == right


def test_projection_request_is_read_once_and_checked(monkeypatch):
    x, w = inputs(16, 64, 128, torch.bfloat16, seed=10)
    monkeypatch.setenv(select.REQUEST_ENV, "cublas")
    op = SkinnyLinear("triton")
    monkeypatch.setenv(select.REQUEST_ENV, "auto")  # read when the op was built, not per call
    timed = []
    with select.forced_skinny_linear(measure=lambda fn: timed.append(fn) or 1.0):
        op(x, w)
        assert op.bound_choice(x, w) == select.CUBLAS and not timed
    monkeypatch.setenv(select.REQUEST_ENV, "splitk")
    with pytest.raises(ValueError, match="FLASH_DLLM_PROJECTIONS"):
        SkinnyLinear("triton")


def test_a_config_that_fails_to_run_is_skipped_with_a_warning(monkeypatch):
    """Whatever a config raises while it is tried (a compiler or driver error of a GPU we never saw), the
    selector goes on without it: the projection still runs, through cuBLAS here."""
    x, w = inputs(16, 64, 128, torch.bfloat16, seed=12)
    broken = SplitKConfig(16, 32, 32, 2, 2, 4, False)

    class Failing(select.SplitKLauncher):
        def __call__(self, x, weight, out=None):
            raise AssertionError("descriptor rejected")

    monkeypatch.setattr(select, "SplitKLauncher", Failing)
    op = SkinnyLinear("triton")
    with pytest.warns(UserWarning, match="descriptor rejected"):
        with select.forced_skinny_linear(candidates=(select.CUBLAS, broken), measure=lambda fn: fn() or 1.0):
            out = op(x, w)
            assert op.bound_choice(x, w) == select.CUBLAS
    assert same_bits(out, F.linear(x, w))
