"""Tuned fused QKV choices persist across processes (kernels/_tuning_store.py).

A "later process" is simulated by a new forcing with the same store: choices made in memory are keyed by the
forcing, so the in-process caches miss and only the store can answer. Its measure is a timer that fails the
test if it is ever called.
"""
from kernel_testing import Layer, compare, needs_triton, tokens  # (kernel_testing sets TRITON_INTERPRET first)

import json  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from flash_dllm.kernels import _fused_qkv_pointer as pointer_module  # noqa: E402
from flash_dllm.kernels._tuning_store import TuningStore  # noqa: E402
from flash_dllm.kernels.fused_qkv_rope_cache import (FusedQKVChoice, FusedQKVRopeCache, forced_fused_qkv,  # noqa: E402
                                                     fused_qkv_choice, fused_qkv_counters, fused_qkv_problem_key)

pytestmark = needs_triton
CANDIDATES = [pointer_module.PointerConfig(16, 16, 32, 1, 4), pointer_module.PointerConfig(32, 32, 64, 1, 4, 2)]


def scripted(times_ms):
    """A measure that runs the launch and returns the next scripted time; calling it once too often fails."""
    times = iter(times_ms)

    def measure(fn):
        fn()
        try:
            return next(times)
        except StopIteration:
            pytest.fail("the tuner timed a launch that the store should have answered")

    return measure


def run_once(store, measure, candidates=CANDIDATES, n_tokens=9):
    """One fresh op's first call under a forcing with this store; returns (counters before, after, choice)."""
    layer = Layer(4, 2, head_dim=16, d_model=64, bias=True, dtype=torch.float32)
    n_cache_rows = max(20, n_tokens)
    x, positions, cache_rows = tokens(n_tokens, 64, torch.float32, n_cache_rows=n_cache_rows)
    op = FusedQKVRopeCache("triton", 4, 2)
    with forced_fused_qkv(path="pointer", pointer_configs=candidates, measure=measure, store=store):
        before = fused_qkv_counters()
        compare(layer, x, positions, cache_rows, n_cache_rows, run=lambda *args: layer.call(op, *args))
        after = fused_qkv_counters()
        choice = fused_qkv_choice(fused_qkv_problem_key(x, layer.w, True, 4))
    return before, after, choice


def test_a_timed_choice_is_read_back_by_a_later_process(tmp_path):
    store = TuningStore(tmp_path)
    before, after, first = run_once(store, scripted([2.0, 1.0]))
    assert first == FusedQKVChoice("pointer", CANDIDATES[1])
    assert after.measurements == before.measurements + 2 and after.stored_choices_read == before.stored_choices_read
    (saved,) = tmp_path.glob("fused_qkv-*.json")
    assert json.loads(saved.read_text())["path"] == "pointer"

    before, after, again = run_once(TuningStore(tmp_path), scripted([]))  # a new store object: only the disk
    assert again == first
    assert after.measurements == before.measurements
    assert after.stored_choices_read == before.stored_choices_read + 1


def test_other_candidates_or_another_bucket_are_timed_afresh(tmp_path):
    store = TuningStore(tmp_path)
    run_once(store, scripted([2.0, 1.0]))
    _, _, choice = run_once(store, scripted([1.0, 2.0, 3.0]), candidates=CANDIDATES + [pointer_module.PointerConfig(
        32, 16, 32, 1, 4)])
    assert choice == FusedQKVChoice("pointer", CANDIDATES[0])
    before, after, _ = run_once(store, scripted([5.0, 4.0]), n_tokens=40)  # bucket 64, not 16
    assert after.measurements == before.measurements + 2
    assert len(list(tmp_path.glob("fused_qkv-*.json"))) == 3


@pytest.mark.parametrize("content", ["{not json", "[]", '{"path": "tma", "config": {}}',
                                     '{"path": "pointer", "config": {"block_m": 999}}'])
def test_an_unreadable_or_foreign_file_is_a_miss_and_is_rewritten(tmp_path, content):
    store = TuningStore(tmp_path)
    run_once(store, scripted([2.0, 1.0]))
    (saved,) = tmp_path.glob("fused_qkv-*.json")
    saved.write_text(content)
    before, after, choice = run_once(TuningStore(tmp_path), scripted([1.0, 2.0]))
    assert after.measurements == before.measurements + 2 and choice == FusedQKVChoice("pointer", CANDIDATES[0])
    assert json.loads(saved.read_text())["config"]["block_m"] == 16


def test_a_forced_measure_without_a_store_writes_nothing(tmp_path, monkeypatch):
    """Forced candidates or measures make choices of their own: they must not reach the default store."""
    import triton

    monkeypatch.setattr(triton.knobs.cache, "dir", str(tmp_path))
    run_once(None, scripted([2.0, 1.0]))
    assert not any(tmp_path.rglob("*.json"))


def test_a_directory_that_cannot_be_written_only_costs_the_next_tuning(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    store = TuningStore(blocker / "below")
    store.save("fused_qkv", ["a"], {"path": "pointer"})  # no exception
    assert store.load("fused_qkv", ["a"]) is None


def test_the_key_separates_what_could_change_the_answer(tmp_path):
    store = TuningStore(tmp_path)
    store.save("fused_qkv", ["H100 sm_90", "src1", "problem"], {"x": 1})
    assert store.load("fused_qkv", ["H100 sm_90", "src1", "problem"]) == {"x": 1}
    for other in (["RTX 3090 sm_86", "src1", "problem"], ["H100 sm_90", "src2", "problem"],
                  ["H100 sm_90", "src1", "problem2"], ["H100 sm_90", "src1problem"]):
        assert store.load("fused_qkv", other) is None
