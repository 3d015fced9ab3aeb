"""canvas_commit: the Triton kernel (interpreter on CPU) against the tensor-operation reference, exactly.

Random canvases in every state a decode step meets: masked and committed cells, padding after an end, rows
that are inactive or out of scheduled steps, candidates that are empty (-1), already committed, past the end
or past gen_len, [MASK] tokens, end tokens earlier and later than the current end (several in one row), both
end rules, a rank base, and widths past one BLOCK_G chunk.
"""
from kernel_testing import DEVICE, needs_triton  # noqa: F401  (sets TRITON_INTERPRET first)

import pytest  # noqa: E402
import torch  # noqa: E402

from flash_dllm.kernels.canvas_commit import CanvasCommit, canvas_commit, canvas_commit_reference  # noqa: E402

pytestmark = needs_triton

MASK_ID, EOS_ID, EOT_ID, NOT_NEW = 7, 2, 3, 1 << 40
END_IDS = (EOS_ID, EOT_ID)


def random_canvas(S, G, R, seed, official_share=0.5, with_base=False):
    gen = torch.Generator().manual_seed(seed)

    def ints(low, high, *shape):
        return torch.randint(low, high, shape, generator=gen)

    gen_len = ints(1, G + 1, S)
    prompt_len = ints(0, 9, S)
    L = int((prompt_len + G).max()) + 3
    official = torch.rand(S, generator=gen) < official_share
    answer = torch.where(torch.rand(S, G, generator=gen) < 0.6, -1, ints(10, 40, S, G))
    end = torch.where(torch.rand(S, generator=gen) < 0.4, (gen_len * torch.rand(S, generator=gen)).long(), gen_len)
    for s in range(S):  # a canvas as the stop rule leaves it: the end token, then padding
        answer[s, int(gen_len[s]):] = EOS_ID
        if int(end[s]) < int(gen_len[s]):
            answer[s, int(end[s])] = EOS_ID
            if not bool(official[s]):
                answer[s, int(end[s]) + 1:] = EOS_ID
    newly_rank = torch.where(torch.rand(S, G, generator=gen) < 0.2, ints(0, 5, S, G), NOT_NEW)
    model_tokens = ints(10, 40, S, L + 1)
    for s in range(S):
        p, g = int(prompt_len[s]), int(gen_len[s])
        model_tokens[s, p:p + g] = torch.where(answer[s, :g] < 0, MASK_ID, answer[s, :g])
    # candidates: distinct cells per row (some past gen_len, some already committed), or -1
    cells = torch.stack([torch.randperm(G, generator=gen)[:R] for _ in range(S)]) if R <= G else ints(0, G, S, R)
    cells = torch.where(torch.rand(S, R, generator=gen) < 0.15, -1, cells)
    pick = torch.rand(S, R, generator=gen)
    tokens = torch.where(pick < 0.1, MASK_ID, torch.where(pick < 0.2, EOS_ID, torch.where(pick < 0.25, EOT_ID,
                                                                                          ints(10, 40, S, R))))
    state = dict(
        answer=answer, confidence=torch.rand(S, G, generator=gen, dtype=torch.float64), newly_rank=newly_rank,
        end=end, model_tokens=model_tokens, cells=cells, tokens=tokens,
        confidences=torch.rand(S, R, generator=gen, dtype=torch.float64),
        chosen=torch.rand(S, R, generator=gen) < 0.7, rank_base=ints(0, 6, S) if with_base else None,
        active=torch.rand(S, generator=gen) < 0.85, official_end=official, gen_len=gen_len, prompt_len=prompt_len,
        steps=ints(0, 4, S), max_steps=torch.where(torch.rand(S, generator=gen) < 0.15, 2, 1 << 40),
        end_ids=torch.tensor(END_IDS))
    return {k: v.to(DEVICE) if v is not None else None for k, v in state.items()}


def run(state, fn):
    written = ("answer", "confidence", "newly_rank", "end", "model_tokens")  # the rest is read only (and kept as
    state = {k: v.clone() if k in written else v for k, v in state.items()}  # passed: clone() packs strided views)
    committed = fn(*state.values(), mask_id=MASK_ID, eos_id=EOS_ID, not_new=NOT_NEW)
    state["model_tokens"] = state["model_tokens"][:, :-1]  # the dump column is the reference's business
    return state, committed


def reference(*args, mask_id, eos_id, not_new):
    return canvas_commit_reference(*args, mask_id, eos_id, not_new)


@pytest.mark.parametrize("S,G,R,seed", [(1, 16, 16, 0), (5, 40, 13, 1), (9, 64, 32, 2), (4, 300, 48, 3),
                                        (6, 20, 20, 4), (3, 7, 3, 5)])
@pytest.mark.parametrize("with_base", [False, True])
def test_kernel_equals_reference(S, G, R, seed, with_base):
    state = random_canvas(S, G, R, seed, with_base=with_base)
    want, want_n = run(state, reference)
    got, got_n = run(state, CanvasCommit("triton"))
    assert torch.equal(got_n, want_n)
    for name in ("answer", "confidence", "newly_rank", "end", "model_tokens"):
        assert torch.equal(got[name], want[name]), name


def test_cases_exercise_every_rule():
    """The random states above really commit, end answers early, pad, skip [MASK] and respect both rules."""
    seen = dict(committed=0, moved_end=0, padded=0, mask_skipped=0, official_kept_masks=0)
    for seed in range(6):
        state = random_canvas(9, 64, 32, seed)
        after, n = run(state, reference)
        seen["committed"] += int(n.sum())
        moved = after["end"] < state["end"]
        seen["moved_end"] += int(moved.sum())
        stop, official = moved & ~state["official_end"], moved & state["official_end"]
        for s in torch.nonzero(stop).flatten().tolist():
            e, g = int(after["end"][s]), int(state["gen_len"][s])
            was_masked = bool((state["answer"][s, e + 1:g] < 0).any())
            seen["padded"] += int(was_masked and bool((after["answer"][s, e + 1:g] == EOS_ID).all()))
        for s in torch.nonzero(official).flatten().tolist():
            seen["official_kept_masks"] += int((after["answer"][s, int(after["end"][s]) + 1:] < 0).any())
        chosen_mask = state["chosen"] & (state["tokens"] == MASK_ID) & (state["cells"] >= 0)
        cells = state["cells"].clamp(min=0)
        seen["mask_skipped"] += int((chosen_mask & (after["answer"].gather(1, cells) < 0)).sum())
    assert all(v > 0 for v in seen.values()), seen


def test_dispatcher_checks_and_runs_both_backends():
    state = random_canvas(3, 24, 8, 7)
    want, _ = run(state, reference)
    for backend in ("torch", "triton"):
        got, _ = run(state, lambda *a, **k: canvas_commit(*a, backend=backend, **k))
        assert torch.equal(got["answer"], want["answer"])
    bad = dict(state, tokens=state["tokens"].int())
    with pytest.raises(ValueError, match="tokens must be"):
        canvas_commit(*bad.values(), mask_id=MASK_ID, eos_id=EOS_ID, not_new=NOT_NEW)
    bad = dict(state, answer=state["answer"].t().contiguous().t())
    with pytest.raises(ValueError):
        canvas_commit(*bad.values(), mask_id=MASK_ID, eos_id=EOS_ID, not_new=NOT_NEW)


def test_empty_candidate_list_commits_nothing():
    state = random_canvas(2, 16, 4, 8)
    state = dict(state, cells=state["cells"][:, :0].contiguous(), tokens=state["tokens"][:, :0].contiguous(),
                 confidences=state["confidences"][:, :0].contiguous(), chosen=state["chosen"][:, :0].contiguous())
    for fn in (reference, CanvasCommit("triton")):
        after, n = run(state, fn)
        assert n.tolist() == [0, 0]
        assert torch.equal(after["answer"], state["answer"])


def test_candidates_may_be_column_slices_of_wider_tensors():
    """Methods pass views (the window is the first columns of window + look-ahead): rows are strided."""
    state = random_canvas(5, 48, 24, 9)
    wide = {k: torch.cat([state[k], state[k]], dim=1) for k in ("cells", "tokens", "confidences", "chosen")}
    sliced = dict(state, **{k: v[:, :24] for k, v in wide.items()})
    assert not sliced["cells"].is_contiguous()
    want, want_n = run(state, reference)
    got, got_n = run(sliced, CanvasCommit("triton"))
    assert torch.equal(got_n, want_n)
    for name in ("answer", "confidence", "newly_rank", "end", "model_tokens"):
        assert torch.equal(got[name], want[name]), name
