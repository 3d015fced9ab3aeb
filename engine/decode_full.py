"""Reference decoding: a full bidirectional forward of every active sequence at every step (no cache).

Used by the `llada` method (blocks + low-confidence top-k, optional classifier-free guidance) and, with the
window strategy, as the oracle that Flash-Cache must reproduce when it tracks everything. Plain PyTorch.
Each sequence advances on its own (its own block, its own schedule), so a batch gives the same greedy tokens
as single runs; a batch is left-padded and the padding is masked out of attention.
"""
from __future__ import annotations

import time

import torch

from flash_dllm.engine.canvas import SequenceState
from flash_dllm.engine.decode_common import DecodeContext, emit_step, logit_position, predict
from flash_dllm.engine.model import forward_hidden, lm_logits


def padded_batch(states: list[SequenceState], device, mask_prompt: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ids [B, L] and key mask [B, L]. mask_prompt replaces prompt tokens by [MASK] (CFG's
    unconditional branch)."""
    length = max(s.total_len for s in states)
    ids = torch.full((len(states), length), states[0].eos_id, dtype=torch.long)
    keep = torch.zeros((len(states), length), dtype=torch.bool)
    for row, state in enumerate(states):
        tokens = state.tokens()
        if mask_prompt:
            tokens[: state.prompt_len] = [state.mask_id] * state.prompt_len
        ids[row, length - len(tokens):] = torch.tensor(tokens)
        keep[row, length - len(tokens):] = True
    return ids.to(device), keep.to(device)


def candidate_logits(ctx: DecodeContext, states, cells_per_row, mask_prompt=False) -> torch.Tensor:
    """Logits [sum of cells, V] at the candidate cells of each row, from one full forward."""
    ids, keep = padded_batch(states, ctx.model.device, mask_prompt)
    hidden = forward_hidden(ctx.model, ids, keep)
    length = ids.shape[1]
    rows, cols = [], []
    for row, (state, cells) in enumerate(zip(states, cells_per_row)):
        pad = length - state.total_len
        for cell in cells:
            rows.append(row)
            cols.append(pad + logit_position(state, cell, ctx.model.config.shift_logits))
    index_rows = torch.tensor(rows, device=ids.device, dtype=torch.long)
    index_cols = torch.tensor(cols, device=ids.device, dtype=torch.long)
    return lm_logits(ctx.model, hidden[index_rows, index_cols])


@torch.no_grad()
def run_full(ctx: DecodeContext, states: list[SequenceState], strategy) -> None:
    """Decode until every sequence is done or cancelled. `strategy` supplies candidates and selection."""
    cfg_scale = ctx.settings.cfg_scale
    while active := ctx.still_decoding(states):
        started = time.perf_counter()
        cells_per_row = [strategy.candidates(s) for s in active]
        logits = candidate_logits(ctx, active, cells_per_row)
        if cfg_scale > 0:  # LLaDA's guidance: un + (scale + 1) * (cond - un)
            uncond = candidate_logits(ctx, active, cells_per_row, mask_prompt=True)
            logits = uncond + (cfg_scale + 1.0) * (logits - uncond)
        pred = predict(logits, ctx.settings.temperature, ctx.generator)
        offset = 0
        for state, cells in zip(active, cells_per_row):
            tokens = pred.tokens[offset: offset + len(cells)]
            confs = pred.confidences[offset: offset + len(cells)]
            offset += len(cells)
            state.forward_passes += 2 if cfg_scale > 0 else 1
            state.begin_step()
            end_before = state.end
            chosen = strategy.select(state, cells, tokens, confs)
            state.commit([cells[i] for i in chosen], [tokens[i] for i in chosen], [confs[i] for i in chosen])
            emit_step(ctx, state, [cells[i] for i in chosen], cells, end_before, started)
