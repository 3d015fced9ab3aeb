"""The host reference decoder: every decision made on plain Python lists, one sequence at a time.

It is the readable statement of what each method does (engine/strategies.py, refresh.py, verify.py) and
the oracle the production decoder (engine/decode_loop.py) is tested against, token for token and event for
event. It shares only the forward with the production decoder: its decisions are turned into the same packed
tensors (a QueryPlan, a VerifyBatch) and run through the same DecodeSession pieces, so any difference between
the two comes from a decision, never from rounding.
"""
from __future__ import annotations

import threading
import time

import torch

from flash_dllm.engine.decode_loop import DecodeSession, VerifySpec
from flash_dllm.engine.device_canvas import DeviceCanvas
from flash_dllm.engine.device_verify import VerifyBatch
from flash_dllm.engine.events import StepEvent
from flash_dllm.engine.methods import METHODS
from flash_dllm.engine.model import DiffusionLM, KernelOps, forward_cached, lm_logits
from flash_dllm.engine.packing import QueryPlan
from flash_dllm.engine.sampling import VERIFY_PASS, predict
from flash_dllm.engine.sequence import SequenceState
from flash_dllm.engine.settings import GenerationSettings
from flash_dllm.engine.strategies import ensure_progress
from flash_dllm.engine.verify import accept_cumulative, accept_paper, padded, pick_candidates


def slot_length(total_lengths: list[int]) -> int:
    """Positions per cache slot: the longest sequence, rounded up to a multiple of 16 (so calls whose
    lengths differ a little share a decode session and its captured graph)."""
    return (max(total_lengths) + 15) // 16 * 16


def emit_step(emit, piece, state: SequenceState, cells: list[int], window: list[int], end_before: int | None,
              started: float, step_started: float, **extra) -> None:
    """Count the step and send its StepEvent (cells: committed this step, in commit order; those that became
    padding are not reported)."""
    kept = [c for c in cells if state.answer[c] >= 0 and not state.is_padding(c)]
    now = time.perf_counter()
    emit(StepEvent(
        seq=state.index, step=state.steps, committed=kept, tokens=[state.answer[c] for c in kept],
        pieces=[piece(state.answer[c]) for c in kept], confidences=[round(state.confidence[c], 4) for c in kept],
        window=list(window), padding_from=None if state.end in (end_before, None) or state.official_end else state.end + 1,
        forward_passes=state.forward_passes, verify_passes=state.verify_passes,
        generated_tokens=len(state.answer_ids()), elapsed_s=now - started, step_ms=(now - step_started) * 1000.0,
        **extra))
    state.steps += 1


class Reference:
    def __init__(self, model: DiffusionLM, ops: KernelOps, settings: GenerationSettings, states: list[SequenceState]):
        self.settings, self.states, self.model = settings, states, model
        method = METHODS[settings.method]
        shift = model.config.shift_logits
        self.strategy, self.policy = method.build_reference(settings, shift)
        cfg = model.config
        canvas = DeviceCanvas.allocate(len(states), slot_length([s.total_len for s in states]),
                                       max(s.gen_length for s in states), cfg.mask_id, cfg.eos_id,
                                       states[0].end_ids, model.device)
        canvas.load([s.prompt_ids for s in states], [s.gen_length for s in states],
                    [settings.seed_for(s.index) for s in states], settings.threshold, settings.gamma,
                    settings.temperature)
        device_method = method.build_device(settings, canvas, shift)  # for its budgets only
        verify = VerifySpec(settings.candidates_cap, settings.acceptance) if method.verify else None
        self.session = DecodeSession(model, ops, device_method, canvas, verify, settings.temperature > 0,
                                     settings.cfg_scale, graphs=False)
        self.forwards_per_step = device_method.forwards_per_step
        self.shift = shift
        self.mask_id = cfg.mask_id
        for state in states:
            state.official_end = settings.resolved_end_rule == "official"
            state.max_steps = device_method.step_limit

    def mirror(self, active: list[SequenceState]) -> None:
        """Copy the host states into the canvas that the shared forward reads."""
        canvas = self.session.canvas
        live = {s.index for s in active}
        for state in self.states:
            row = torch.tensor(state.tokens(), dtype=torch.int64)
            canvas.tokens[state.index, : len(row)] = row.to(canvas.tokens.device)
            canvas.answer[state.index, : state.gen_length] = torch.tensor(state.answer, dtype=torch.int64)
            canvas.steps[state.index] = state.steps
            canvas.active[state.index] = state.index in live

    def step(self, active: list[SequenceState], emit, piece, started: float) -> None:
        step_started = time.perf_counter()
        self.mirror(active)
        S, R = len(self.states), self.session.method.readout
        L = self.session.canvas.slot_len
        cells = {s.index: self.strategy.candidates(s) for s in active}
        in_query = torch.zeros((S, L), dtype=torch.bool)
        scored = torch.zeros((S, L), dtype=torch.bool) if self.policy.tracks_attention else None
        for state in active:
            in_query[state.index, self.policy.queries(state, cells[state.index])] = True
            if scored is not None:
                scored[state.index, [state.prompt_len + c for c in cells[state.index]]] = True
        device = self.session.canvas.answer.device
        plan = QueryPlan(in_query=in_query.to(device),
                         cells=padded([cells.get(i, []) for i in range(S)], R).to(device),
                         scored=scored.to(device) if scored is not None else None)
        full = torch.tensor([s in active and (s.steps == 0 or self.policy.recomputes_everything(s))
                             for s in self.states])
        if scored is not None:
            self.session.cache.scores.zero_()
        preds = self.session._draft(plan, self.session._layouts(full))
        if scored is not None:
            self.policy.note_attention(self.session.cache.slot_scores(), active)
        tokens, confs = preds.tokens.tolist(), preds.confidences.tolist()
        fallback, fallback_confs = preds.fallback_tokens.tolist(), preds.fallback_confidences.tolist()
        done, pending = [], []
        for state in active:
            row = cells[state.index]
            n = len(row)
            toks, conf = tokens[state.index][:n], confs[state.index][:n]
            state.begin_step()
            state.forward_passes += self.forwards_per_step
            end_before = state.end
            chosen = self.strategy.select(state, row, toks, conf)
            if self.strategy.guards_progress:
                chosen, toks, conf = ensure_progress(chosen, toks, conf, fallback[state.index][:n],
                                                     fallback_confs[state.index][:n], self.mask_id)
            state.commit([row[i] for i in chosen], [toks[i] for i in chosen], [conf[i] for i in chosen])
            self.strategy.end_step(state)
            done.append((state, [row[i] for i in chosen], row, end_before))
            if self.session.verifier is not None and not state.done:
                real = [i for i in range(n) if toks[i] != self.mask_id]  # a [MASK] draft has nothing to verify
                cands = pick_candidates([row[i] for i in real], [toks[i] for i in real], [conf[i] for i in real],
                                        state, self.settings.candidates_cap)
                if cands.cells:
                    pending.append((state, list(state.newly_committed)[: self.settings.window], cands))
        outcome = self.verify(pending) if pending else {}
        for state, committed, row, end_before in done:
            extra = outcome.get(state.index, {})
            if extra:
                extra["draft_pieces"] = [piece(t) for t in extra["draft_tokens"]]
            emit_step(emit, piece, state, committed + extra.get("accepted", []), row, end_before, started,
                      step_started, **extra)

    def verify(self, pending) -> dict[int, dict]:
        """One verify pass for the sequences with candidates; commits the accepted prefixes."""
        session, S = self.session, len(self.states)
        self.mirror([state for state, _, _ in pending])
        cap, window = session.verifier.cap, self.settings.window  # the pass's cap: at most the window
        by_slot = {state.index: (tracked, cands) for state, tracked, cands in pending}
        device = session.canvas.answer.device
        batch = VerifyBatch(
            tracked=padded([by_slot[i][0] if i in by_slot else [] for i in range(S)], window).to(device),
            cells=padded([by_slot[i][1].cells if i in by_slot else [] for i in range(S)], cap).to(device),
            drafts=padded([by_slot[i][1].drafts if i in by_slot else [] for i in range(S)], cap,
                          fill=session.canvas.mask_id).to(device))
        step, hidden_rows = session.verifier.layout.pack(batch)
        hidden = forward_cached(self.model, session.cache.k, session.cache.v, step, session.ops, None)
        session.cache.keep.index_fill_(0, hidden_rows, 1)
        keys, temperature = session._keys_and_temperature(None, batch.cells, VERIFY_PASS)
        p = predict(lm_logits(self.model, hidden), temperature, keys, given_tokens=batch.drafts.reshape(-1))
        top, conf = p.tokens.view(S, cap).tolist(), p.confidences.view(S, cap).tolist()
        probs = p.probs_of_given.view(S, cap).tolist()
        outcome = {}
        for state, _, cands in pending:
            n, i = len(cands.cells), state.index
            if self.settings.acceptance == "paper":
                accepted = accept_paper(cands.drafts, top[i][:n], conf[i][:n], self.settings.gamma)
            else:
                accepted = accept_cumulative(probs[i][:n], self.settings.gamma)
            state.forward_passes += 1
            state.verify_passes += 1
            state.commit(cands.cells[:accepted], cands.drafts[:accepted], probs[i][:accepted])
            state.accepted_drafts += accepted
            state.rejected_drafts += n - accepted
            outcome[i] = dict(drafted=list(cands.cells), draft_tokens=list(cands.drafts),
                              accepted=cands.cells[:accepted], rejected=cands.cells[accepted:])
        return outcome


def stopped(active: list[SequenceState], cancel: threading.Event | None) -> bool:
    """True (and every active sequence marked cancelled) once the caller has asked to stop."""
    if cancel is None or not cancel.is_set():
        return False
    for state in active:
        state.cancelled = True
    return True


@torch.no_grad()
def run_reference(model: DiffusionLM, ops: KernelOps, settings: GenerationSettings, states: list[SequenceState],
                  emit=lambda event: None, piece=str, cancel: threading.Event | None = None) -> None:
    """Decode until every sequence is done or cancelled, deciding on the host."""
    own = METHODS[settings.method].host_reference
    if own is not None:  # a method whose reference is its own plain decoder (block-diffusion)
        return own(model, ops, settings, states, emit, piece, cancel)
    reference = Reference(model, ops, settings, states)
    started = time.perf_counter()
    while (active := [s for s in states if not s.done]) and not stopped(active, cancel):
        reference.step(active, emit, piece, started)

