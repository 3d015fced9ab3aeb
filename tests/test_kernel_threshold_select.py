"""threshold_select: the Triton kernel (interpreter on CPU) against the tensor-operation reference, exactly,
and the reference against the host rules (engine/strategies.py) row by row."""
from kernel_testing import DEVICE, needs_triton  # noqa: F401  (sets TRITON_INTERPRET first)

import pytest  # noqa: E402
import torch  # noqa: E402

from flash_dllm.engine import strategies  # noqa: E402
from flash_dllm.kernels.threshold_select import (ThresholdSelect, threshold_select,  # noqa: E402
                                                 threshold_select_reference)

pytestmark = needs_triton

MASK_ID = 5


def random_rows(S, R, seed):
    """Confidences with ties and values at the threshold, [MASK] predictions, empty candidates."""
    gen = torch.Generator().manual_seed(seed)
    cells = torch.where(torch.rand(S, R, generator=gen) < 0.2, -1, torch.randint(0, 64, (S, R), generator=gen))
    cells[0] = -1  # a row with no candidate
    levels = torch.tensor([0.1, 0.5, 0.9, 0.95], dtype=torch.float64)
    conf = torch.where(torch.rand(S, R, generator=gen) < 0.5, levels[torch.randint(0, 4, (S, R), generator=gen)],
                       torch.rand(S, R, generator=gen, dtype=torch.float64))
    tokens = torch.where(torch.rand(S, R, generator=gen) < 0.3, MASK_ID, torch.randint(10, 30, (S, R), generator=gen))
    tokens[1] = MASK_ID  # every prediction [MASK]: the fallback must step in
    fb_tokens = torch.randint(10, 30, (S, R), generator=gen)
    fb_conf = torch.where(torch.rand(S, R, generator=gen) < 0.3, 0.25, torch.rand(S, R, generator=gen,
                                                                                     dtype=torch.float64) * 0.5)
    threshold = torch.tensor([0.9, 0.5, 1.0, 0.0] * S, dtype=torch.float64)[:S]
    return [t.to(DEVICE) for t in (cells, conf, tokens, fb_tokens, fb_conf, threshold)]


@pytest.mark.parametrize("S,R,seed", [(4, 16, 0), (7, 13, 1), (3, 40, 2), (9, 1, 3), (5, 64, 4)])
def test_kernel_equals_reference(S, R, seed):
    args = random_rows(S, R, seed)
    want = threshold_select_reference(*args, MASK_ID)
    got = ThresholdSelect("triton")(*args, mask_id=MASK_ID)
    for g, w in zip(got, want):
        assert torch.equal(g, w)


@pytest.mark.parametrize("seed", range(4))
def test_reference_is_the_host_rule(seed):
    """Per row: the host's threshold_select, then its ensure_progress, over the valid candidates in order."""
    cells, conf, tokens, fb_tokens, fb_conf, threshold = [t.cpu() for t in random_rows(8, 12, seed)]
    chosen, new_tokens, new_conf = threshold_select_reference(cells, conf, tokens, fb_tokens, fb_conf, threshold,
                                                              MASK_ID)
    for s in range(8):
        idx = [j for j in range(12) if cells[s, j] >= 0]
        if not idx:
            assert not chosen[s].any()
            continue
        picked = strategies.threshold_select([float(conf[s, j]) for j in idx], float(threshold[s]))
        picked, toks, confs = strategies.ensure_progress(
            picked, [int(tokens[s, j]) for j in idx], [float(conf[s, j]) for j in idx],
            [int(fb_tokens[s, j]) for j in idx], [float(fb_conf[s, j]) for j in idx], MASK_ID)
        assert sorted(idx[i] for i in picked) == torch.nonzero(chosen[s]).flatten().tolist()
        assert [int(new_tokens[s, j]) for j in idx] == toks
        assert [float(new_conf[s, j]) for j in idx] == confs


def test_dispatcher_checks_inputs_and_runs_both_backends():
    args = random_rows(3, 8, 5)
    want = threshold_select_reference(*args, MASK_ID)
    for backend in ("torch", "triton"):
        assert all(torch.equal(g, w) for g, w in zip(threshold_select(*args, mask_id=MASK_ID, backend=backend),
                                                     want))
    with pytest.raises(ValueError, match="threshold"):
        threshold_select(*args[:5], args[5].float(), mask_id=MASK_ID)
