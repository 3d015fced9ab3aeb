"""The host reference of `block-diffusion`: LLaDA2's block sampler in plain PyTorch, one sequence at a time.

Every step runs the whole prefix up to the current block's end through `forward_full`, whose attention mask is
the model's own (causal across blocks of ``block_size`` positions, bidirectional inside), so nothing is cached
and nothing can be stale. The device decoder (engine/block_diffusion.py) must give the same tokens, forward
passes and StepEvents while it runs only the current block against its KV cache.

Per step of a sequence:
    block      the block (of absolute positions) of its first masked cell: P // B at first, P = prompt length
    forward    logits = forward_full(tokens[:block end]) (the canvas stops at prompt + answer)
    predict    at the block's masked cells (argmax, or a keyed Gumbel sample: engine/sampling.py)
    commit     every prediction with probability > threshold, or, when fewer than the step's quota are, the
               quota's most confident; quotas split B evenly over the block's steps (remainder first), the
               step counter restarting with every block
"""
from __future__ import annotations

import threading
import time

import torch

from flash_dllm.engine.host_reference import emit_step, stopped
from flash_dllm.engine.model import DiffusionLM, forward_full
from flash_dllm.engine.sampling import DRAFT_PASS, noise_keys, predict
from flash_dllm.engine.sequence import SequenceState
from flash_dllm.engine.settings import GenerationSettings
from flash_dllm.engine.strategies import ensure_progress, split_evenly, top_k


def current_block(state: SequenceState, block_size: int) -> int:
    return (state.prompt_len + state.masked_cells()[0]) // block_size


def llada2_commit_indices(confidences: list[float], threshold: float, quota: int) -> list[int]:
    """Indices of the candidates to commit: all above the threshold when at least `quota` are, else the
    `quota` most confident (ties: the earlier cell)."""
    above = sum(1 for c in confidences if c > threshold)
    return top_k(confidences, max(above, quota))


@torch.no_grad()
def run_block_reference(model: DiffusionLM, settings: GenerationSettings, states: list[SequenceState],
                        emit=lambda event: None, piece=str, cancel: threading.Event | None = None) -> None:
    """Decode every sequence to its end (or until cancelled), each step a full forward over its prefix."""
    if settings.method != "block-diffusion":
        # Flash-Verify's pass reads the K/V that the draft forward left in the cache (stale by design for the
        # cells it re-presents), which a cache-free forward cannot express: no plain reference for it.
        raise NotImplementedError(f"{settings.method} has no plain host reference (see engine/block_diffusion.py)")
    B = model.config.block_size
    steps_per_block = settings.total_steps // settings.n_blocks
    schedule = split_evenly(B, steps_per_block)
    block_of = {s.index: current_block(s, B) for s in states if not s.done}
    step_in_block = {s.index: 0 for s in states}
    sampling = settings.temperature > 0
    started = time.perf_counter()
    while (active := [s for s in states if not s.done]) and not stopped(active, cancel):
        for state in active:  # one step of every sequence, in slot order (as the device records them)
            step_started = time.perf_counter()
            block = block_of[state.index]
            stop = min((block + 1) * B, state.total_len)
            cells = [c for c in state.masked_cells() if block * B <= state.prompt_len + c < stop]
            ids = torch.tensor([state.tokens()[:stop]], device=model.device)
            logits = forward_full(model, ids)[0, [state.prompt_len + c for c in cells]]
            cell_ids = torch.tensor(cells, device=model.device)
            keys = temperature = None
            if sampling:
                seed = torch.tensor(settings.seed_for(state.index) & 0xFFFFFFFF, device=model.device)
                keys = noise_keys(seed, torch.tensor(state.steps, device=model.device), DRAFT_PASS, cell_ids)
                temperature = torch.full((len(cells),), float(settings.temperature), dtype=torch.float64,
                                         device=model.device)
            preds = predict(logits, temperature, keys, mask_id=state.mask_id)
            tokens, confidences = preds.tokens.tolist(), preds.confidences.tolist()
            quota = schedule[min(step_in_block[state.index], steps_per_block - 1)]
            chosen = llada2_commit_indices(confidences, settings.threshold, quota)
            chosen, tokens, confidences = ensure_progress(chosen, tokens, confidences, preds.fallback_tokens.tolist(),
                                                          preds.fallback_confidences.tolist(), state.mask_id)
            state.begin_step()
            state.forward_passes += 1
            end_before = state.end
            state.commit([cells[i] for i in chosen], [tokens[i] for i in chosen], [confidences[i] for i in chosen])
            step_in_block[state.index] += 1
            if not state.done and current_block(state, B) != block:
                block_of[state.index], step_in_block[state.index] = current_block(state, B), 0
            emit_step(emit, piece, state, [cells[i] for i in chosen], cells, end_before, started, step_started)
