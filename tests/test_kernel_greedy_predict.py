"""greedy_predict: the Triton kernels (interpreter on CPU) against the reference: tokens exactly, probabilities
to fp64 rounding; ties (frequent in bf16) to the lowest index, across chunk boundaries too."""
from kernel_testing import DEVICE, needs_triton  # noqa: F401  (sets TRITON_INTERPRET first)

import pytest  # noqa: E402
import torch  # noqa: E402

from flash_dllm.kernels._greedy_predict_triton import CHUNK  # noqa: E402
from flash_dllm.kernels.greedy_predict import GreedyPredict, greedy_predict, greedy_predict_reference  # noqa: E402

pytestmark = needs_triton


def check(logits, mask_id, given):
    want = greedy_predict_reference(logits, mask_id, given)
    got = GreedyPredict("triton")(logits, mask_id, given)
    for name, g, w in zip(("tokens", "confidences", "fallback", "fallback_conf", "given"), got, want):
        assert (g is None) == (w is None), name
        if w is None:
            continue
        if w.dtype == torch.int64:
            assert torch.equal(g, w), name
        else:
            torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-300, msg=name)
    return want


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("M,V", [(16, 300), (5, CHUNK + 1), (3, 3 * CHUNK - 7), (1, 17)])
def test_kernels_equal_reference(dtype, M, V):
    gen = torch.Generator().manual_seed(V + M)
    logits = (torch.randn(M, V, generator=gen) * 3).to(DEVICE, dtype)
    mask_id = V // 2
    logits[0, mask_id] = logits[0].max() + 1  # the argmax is [MASK]: the fallback differs from it
    given = torch.randint(0, V, (M,), generator=gen).to(DEVICE)
    for m, g in ((mask_id, given), (-1, None), (mask_id, None), (-1, given)):
        tokens, *_ = check(logits, m, g)
    assert int(tokens[0]) == mask_id


def test_ties_go_to_the_lowest_index_across_chunks():
    V = 3 * CHUNK
    logits = torch.zeros(4, V, dtype=torch.bfloat16, device=DEVICE)
    logits[0, [5, CHUNK + 3]] = 2.0  # same chunk as the first? no: two chunks, the earlier wins
    logits[1, [CHUNK + 9, 2 * CHUNK + 1]] = 2.0
    logits[2, [7, 8]] = 2.0  # inside one chunk
    logits[3] = 1.0  # every entry ties
    tokens, _, fallback, _, _ = check(logits, 7, None)
    assert tokens.tolist() == [5, CHUNK + 9, 7, 0]
    assert fallback.tolist() == [5, CHUNK + 9, 8, 0]


def test_dispatcher_checks_inputs():
    logits = torch.randn(2, 50, device=DEVICE)
    for backend in ("torch", "triton"):
        assert greedy_predict(logits, 3, None, backend=backend)[0].shape == (2,)
    with pytest.raises(ValueError, match="mask_id"):
        greedy_predict(logits, 50)
    with pytest.raises(ValueError, match="given_tokens"):
        greedy_predict(logits, 3, torch.zeros(3, dtype=torch.int64, device=DEVICE))
    with pytest.raises(ValueError, match="logits"):
        greedy_predict(logits.double(), 3)
