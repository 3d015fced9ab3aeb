"""Continuous batching (engine/scheduler.py): every request submitted concurrently gets exactly its solo answer
and its solo events, whatever joins, leaves, is cancelled, waits for memory or waits for another shape."""
from __future__ import annotations

import threading
import time

import pytest

from flash_dllm.engine import CanvasStart, Engine, GenerationSettings, StepEvent
from flash_dllm.engine import scheduler as scheduler_module
from flash_dllm.engine.scheduler import RowPool

PROMPTS = ["hi", "what is 2+2", "count one two three", "x", "tell me a story about a dog", "abc", "zzz top", "q",
           "a longer prompt, so the slots hold sequences of different lengths", "2*3=?"]


def settings(**changes) -> GenerationSettings:
    return GenerationSettings(method="flash-cache", gen_length=32, block_length=8, window=8, lookahead=8, track=8,
                              threshold=0.6).with_overrides(**changes)


@pytest.fixture(scope="module", params=["tiny_llada", "tiny_dream"])
def engine(request) -> Engine:
    return Engine.load(str(request.getfixturevalue(request.param)), device="cpu")


def step_rows(events) -> list[dict]:
    return [{k: v for k, v in e.to_dict().items() if k not in ("elapsed_s", "step_ms")}
            for e in events if isinstance(e, StepEvent)]


def solo(engine: Engine, prompt, s: GenerationSettings):
    events = []
    result = engine.generate([prompt], s, on_event=events.append)[0]
    return result, step_rows(events)


def submit_all(engine: Engine, jobs, gap_s: float = 0.0):
    """Submit (prompt, settings) jobs from one thread, `gap_s` apart; each request's events and result."""
    streams, requests = [], []
    for prompt, s in jobs:
        events = []
        streams.append(events)
        requests.append(engine.submit(prompt, s, on_event=events.append))
        time.sleep(gap_s)
    return [(r.result(120), step_rows(events)) for r, events in zip(requests, streams)]


@pytest.mark.parametrize("variant", [{}, dict(method="flash-verify", gamma=0.3), dict(method="fast-dllm"),
                                     dict(method="llada"), dict(method="dream", steps=16),
                                     dict(temperature=0.8, seed=7)])
def test_concurrent_requests_get_their_solo_answers_and_events(engine, variant):
    many = PROMPTS + PROMPTS[:scheduler_module.MAX_SLOTS + 1 - len(PROMPTS)]
    jobs = [(p, settings(**variant)) for p in many]  # more requests than slots: some wait for a free one
    expected = [solo(engine, p, s) for p, s in jobs]
    got = submit_all(engine, jobs, gap_s=0.003)
    assert [r.token_ids for r, _ in got] == [r.token_ids for r, _ in expected]
    assert [r.forward_passes for r, _ in got] == [r.forward_passes for r, _ in expected]
    assert [r.finish_reason for r, _ in got] == [r.finish_reason for r, _ in expected]
    assert [events for _, events in got] == [events for _, events in expected]


@pytest.mark.parametrize("defer", [True, False])
def test_fast_dllm_requests_routed_after_the_next_launch_get_their_solo_answers(engine, monkeypatch, defer):
    """As on a GPU (DecodeSession.defer_events), fast-dllm's records, read at once, reach their requests only
    after the next step is launched (and finished requests leave then, or at once when no sequence goes on, so no
    step is launched for nothing); answers and events stay the solo ones."""
    from flash_dllm.engine import decode_loop, scheduler_steps

    jobs = [(p, settings(method="fast-dllm", gen_length=16 + 8 * (i % 3))) for i, p in enumerate(PROMPTS[:6])]
    expected = [solo(engine, p, s) for p, s in jobs]
    init, launch, route = (decode_loop.DecodeSession.__init__, decode_loop.DecodeSession.launch,
                           scheduler_steps.BatchRun._route_read)
    seen = {"launched": False, "deferred": 0, "idle_launches": 0}

    def init_deferring(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.defer_events = defer

    def counting_launch(self, layouts):
        seen["launched"] = True
        seen["idle_launches"] += not bool(self.canvas.active.any())  # a step no sequence needs
        return launch(self, layouts)

    def counting_route(self):
        seen["deferred"] += bool(seen["launched"] and self.unrouted)
        seen["launched"] = False
        route(self)

    monkeypatch.setattr(decode_loop.DecodeSession, "__init__", init_deferring)
    monkeypatch.setattr(decode_loop.DecodeSession, "launch", counting_launch)
    monkeypatch.setattr(scheduler_steps.BatchRun, "_route_read", counting_route)
    got = submit_all(engine, jobs, gap_s=0.003)
    assert [r.token_ids for r, _ in got] == [r.token_ids for r, _ in expected]
    assert [r.finish_reason for r, _ in got] == [r.finish_reason for r, _ in expected]
    assert [events for _, events in got] == [events for _, events in expected]
    assert (seen["deferred"] > 0) == defer and seen["idle_launches"] == 0


def test_per_sequence_settings_mix_in_one_batch(engine):
    """Answer length, threshold, gamma, temperature and seed differ per request and still share steps."""
    mixes = [dict(gen_length=16), dict(threshold=0.3), dict(gen_length=48, threshold=0.95),
             dict(temperature=0.5, seed=3), dict(temperature=1.2, seed=9, gen_length=24)]
    jobs = [(PROMPTS[i], settings(**mix)) for i, mix in enumerate(mixes)]
    jobs = [(p, s.with_overrides(temperature=s.temperature or 0.0)) for p, s in jobs]
    sampled = [(p, s) for p, s in jobs if s.temperature > 0]
    greedy = [(p, s) for p, s in jobs if s.temperature == 0]
    for group in (greedy, sampled):  # sampling is a shape of its own: each group is one batch
        got = submit_all(engine, group)
        assert [r.token_ids for r, _ in got] == [solo(engine, p, s)[0].token_ids for p, s in group]
        assert [len(r.token_ids) <= s.gen_length for (r, _), (_, s) in zip(got, group)] == [True] * len(group)


def test_a_burst_of_requests_is_admitted_into_one_step_within_the_prefill_budget(engine, monkeypatch):
    admitted = []
    admit = scheduler_module.Scheduler.admit

    def recording(self, step):
        slots = admit(self, step)
        admitted.append(len(slots)) if slots else None
        return slots

    monkeypatch.setattr(scheduler_module.Scheduler, "admit", recording)
    jobs = [(p, settings()) for p in PROMPTS[:6]]
    with engine._lock:  # the loop waits, so all six are waiting when it looks
        requests = [engine.submit(p, s) for p, s in jobs]
        time.sleep(0.05)
    assert [r.result(60).token_ids for r in requests] == [solo(engine, p, s)[0].token_ids for p, s in jobs]
    assert admitted[0] == 6
    admitted.clear()
    monkeypatch.setattr(scheduler_module, "PREFILL_ROWS", 1)  # a budget below one request: one per step
    with engine._lock:
        requests = [engine.submit(p, s) for p, s in jobs[:3]]
        time.sleep(0.05)
    [r.result(60) for r in requests]
    assert admitted == [1, 1, 1]


def test_a_queued_request_shows_its_canvas_before_it_is_admitted(engine):
    """The first canvas frame does not wait for a slot or for the prefill steps of a burst: it is sent when the
    request is queued, once, and the request's steps follow it."""
    s = settings()
    events = []
    with engine._lock:  # the loop cannot admit anything yet
        request = engine.submit(PROMPTS[8], s, on_event=events.append)
        time.sleep(0.05)
        assert [type(e) for e in events] == [CanvasStart]
        assert (events[0].gen_length, events[0].block_length, events[0].method) == (32, 8, "flash-cache")
        assert "lengths" in "".join(events[0].prompt_tail)  # the tail of the templated prompt
    result = request.result(60)
    assert sum(isinstance(e, CanvasStart) for e in events) == 1 and isinstance(events[0], CanvasStart)
    assert step_rows(events) == solo(engine, PROMPTS[8], s)[1] and result.token_ids


def test_a_cancelled_request_stops_and_the_others_are_untouched(engine):
    s = settings(gen_length=64, threshold=0.99)
    expected = [solo(engine, p, s)[0].token_ids for p in PROMPTS[:4]]
    first_step = threading.Event()
    victim = engine.submit(PROMPTS[4], s, on_event=lambda e: first_step.set() if isinstance(e, StepEvent) else None)
    others = [engine.submit(p, s) for p in PROMPTS[:4]]
    assert first_step.wait(60)
    victim.cancel()
    result = victim.result(60)
    assert result.finish_reason == "cancelled" and len(result.token_ids) < 64
    assert [r.result(60).token_ids for r in others] == expected


def test_a_request_cancelled_while_waiting_never_runs(engine):
    s = settings(gen_length=64, threshold=0.99)
    running = [engine.submit(p, s) for p in (PROMPTS * 2)[:scheduler_module.MAX_SLOTS]]  # every slot taken
    waiting = engine.submit(PROMPTS[9], s)
    waiting.cancel()
    result = waiting.result(60)
    assert result.finish_reason == "cancelled" and result.token_ids == [] and result.forward_passes == 0
    assert all(r.result(60).finish_reason != "cancelled" for r in running)


def test_a_different_method_waits_for_the_running_batch_and_says_so(engine):
    s = settings(gen_length=64, threshold=0.99)
    running = [engine.submit(p, s) for p in PROMPTS[:3]]
    other = engine.submit(PROMPTS[5], settings(method="fast-dllm"))
    time.sleep(0.05)
    waiting = [i for i in engine.requests_in_flight() if i.id == other.id and i.status == "waiting"]
    assert not waiting or "running batch" in waiting[0].waiting_for
    assert other.result(60).token_ids == solo(engine, PROMPTS[5], settings(method="fast-dllm"))[0].token_ids
    assert all(r.result(60).finish_reason == "length" for r in running)


def test_the_kv_pool_grows_mid_flight_and_answers_stay_solo(engine, monkeypatch):
    monkeypatch.setattr(scheduler_module, "POOL_STEP", 64)  # a pool for about one sequence: it must grow
    engine._requests.drop()
    jobs = [(p, settings(gen_length=48)) for p in PROMPTS[:6]]
    got = submit_all(engine, jobs, gap_s=0.01)
    assert [r.token_ids for r, _ in got] == [solo(engine, p, s)[0].token_ids for p, s in jobs]
    engine._requests.drop()


def test_a_request_that_cannot_fit_waits_for_memory_then_is_refused(engine, monkeypatch):
    monkeypatch.setattr(scheduler_module, "POOL_STEP", 64)
    monkeypatch.setattr(scheduler_module, "_room_for", lambda nbytes, device: False)  # the device is full
    engine._requests.drop()
    request = engine.submit(PROMPTS[8], settings(gen_length=64))
    with pytest.raises(Exception, match="does not fit in the device's memory"):
        request.result(60)
    monkeypatch.undo()
    engine._requests.drop()
    assert engine.submit(PROMPTS[0], settings()).result(60).finish_reason in ("eos", "length")


def test_row_pool_hands_out_disjoint_ranges_and_merges_what_is_given_back():
    pool = RowPool(100)
    a, b, c = pool.take(30), pool.take(30), pool.take(30)
    assert (a, b, c) == (0, 30, 60) and pool.take(20) is None
    pool.give(b, 30)
    assert pool.take(40) is None and pool.take(30) == 30
    pool.give(a, 30)
    pool.give(30, 30)
    assert pool.take(60) == 0
    pool.grow(200)
    assert pool.take(110) == 90


def test_a_dream_session_reads_out_only_its_answer_cells(engine):
    """The dream method reads out every answer cell each step: its session's canvas is the answer length wide,
    not the model's context (which would be gigabytes of logits per step at full size)."""
    s = settings(method="dream", steps=16, gen_length=24, block_length=24)
    assert engine.submit(PROMPTS[1], s).result(60).finish_reason in ("eos", "length")
    assert engine._requests.session.canvas.width == 24
    assert engine._requests.session.method.readout == 24
