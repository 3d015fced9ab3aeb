"""Commit a decode step's chosen tokens into the answer canvases, in one launch.

The device decode step (engine/device_canvas.py) fixes tokens into masked cells after every forward pass.
Written as tensor operations that is some fifty small kernels per commit (two commits per Flash-Verify step),
each a few microseconds of launch and tail on a GPU whose whole step is a few milliseconds; the Triton kernel
does the same per sequence in one program.

Contract (S sequences, G answer cells, R candidates, L positions per slot; all tensors on one device):
    answer        [S, G]      int64 in/out: -1 masked, else the token (eos for padding after the end)
    confidence    [S, G]      float64 in/out: the confidence each cell was committed with
    newly_rank    [S, G]      int64 in/out: commit order of cells committed this step, else not_new
    end           [S]         int64 in/out: first cell holding an end token; gen_len while there is none
    model_tokens  [S, L + 1]  int64 out: the model input ids; answer region [prompt_len, prompt_len + gen_len)
                              rewritten from answer (mask_id where masked); column L is a dump the reference
                              may write and the kernel leaves alone
    cells         [S, R]      int64: candidate cells, -1 = none (no cell appears twice in a row)
    tokens        [S, R]      int64, confidences [S, R] float64: what each candidate would commit
    chosen        [S, R]      bool: which candidates to commit
    rank_base     [S] int64 or None (0): newly_rank of a row's first commit
    active, official_end [S] bool; gen_len, prompt_len, steps, max_steps [S] int64; end_ids [E] int64
Returns committed [S] int64, how many cells each row committed.

Semantics, per row, decided on the canvas as it was before the call (engine/sequence.py is the host model):
a candidate commits when chosen, the row is active, its token is not mask_id and its cell is still to decode
(masked, before the limit: gen_len under the official end rule, else end + 1; and steps < max_steps). The
first committed end token (the smallest such cell) moves `end` there if it is earlier; under the stop rule a
candidate past the new end is dropped, every cell between the new end and gen_len becomes eos padding when the
end moved, and newly_rank past the end is reset. Committed cells get their token, confidence and rank
(rank_base + their order among the row's commits, in candidate order). Exact: integer and copy operations only.
"""
from __future__ import annotations

import torch

from . import bind_backend


def canvas_commit_reference(answer, confidence, newly_rank, end, model_tokens, cells, tokens, confidences, chosen,
                            rank_base, active, official_end, gen_len, prompt_len, steps, max_steps, end_ids,
                            mask_id: int, eos_id: int, not_new: int) -> torch.Tensor:
    """The commit as tensor operations (runs anywhere, inside CUDA graph capture too)."""
    S, width = answer.shape
    if cells.shape[1] == 0:
        return torch.zeros_like(end)
    column = torch.arange(width, device=answer.device)[None, :]
    limit = torch.where(official_end, gen_len, torch.minimum(end + 1, gen_len))
    to_decode = (answer < 0) & (column < limit[:, None]) & (steps < max_steps)[:, None]
    ok = chosen & (cells >= 0) & active[:, None] & (tokens != mask_id)
    at = cells.clamp(0, width - 1)
    ok &= to_decode.gather(1, at)
    is_end = (tokens[..., None] == end_ids).any(-1) & ok
    first_end = torch.where(is_end, at, width).amin(1)
    old_end = end.clone()
    end.copy_(torch.minimum(end, first_end))  # in place: a replayed graph reads these buffers
    ok &= (at <= end[:, None]) | official_end[:, None]
    target = torch.where(ok, at, width)  # column `width` of a widened copy: writes that must not land
    base = rank_base[:, None] if rank_base is not None else 0
    order = torch.cumsum(ok.long(), 1) - 1 + base
    _scatter_cols(answer, target, tokens)
    _scatter_cols(confidence, target, confidences)
    _scatter_cols(newly_rank, target, order)
    pads = (end < old_end) & ~official_end
    past_end = (column > end[:, None]) & (column < gen_len[:, None]) & pads[:, None]
    answer.masked_fill_(past_end, eos_id)
    newly_rank.masked_fill_((column > end[:, None]) & ~official_end[:, None], not_new)
    values = torch.where(answer < 0, mask_id, answer)
    positions = torch.where(column < gen_len[:, None], prompt_len[:, None] + column, model_tokens.shape[1] - 1)
    model_tokens.scatter_(1, positions, values)
    return ok.sum(1)


def _scatter_cols(base: torch.Tensor, index: torch.Tensor, values: torch.Tensor) -> None:
    """In place: base[s, index[s, j]] = values[s, j]; index == base.shape[1] drops the write."""
    wide = torch.cat([base, base[:, :1]], dim=1)
    wide.scatter_(1, index, values.to(base.dtype))
    base.copy_(wide[:, :-1])


def check_canvas_commit_inputs(answer, confidence, newly_rank, end, model_tokens, cells, tokens, confidences,
                               chosen, rank_base, active, official_end, gen_len, prompt_len, steps, max_steps,
                               end_ids) -> None:
    """The contract's shapes, dtypes and layouts; raises ValueError. Run by the dispatcher, not by CanvasCommit."""
    S, G = answer.shape
    R = cells.shape[1] if cells.dim() == 2 else -1
    want = {"answer": (answer, (S, G), torch.int64), "confidence": (confidence, (S, G), torch.float64),
            "newly_rank": (newly_rank, (S, G), torch.int64), "end": (end, (S,), torch.int64),
            "cells": (cells, (S, R), torch.int64), "tokens": (tokens, (S, R), torch.int64),
            "confidences": (confidences, (S, R), torch.float64), "chosen": (chosen, (S, R), torch.bool),
            "active": (active, (S,), torch.bool), "official_end": (official_end, (S,), torch.bool),
            "gen_len": (gen_len, (S,), torch.int64), "prompt_len": (prompt_len, (S,), torch.int64),
            "steps": (steps, (S,), torch.int64), "max_steps": (max_steps, (S,), torch.int64)}
    if rank_base is not None:
        want["rank_base"] = (rank_base, (S,), torch.int64)
    for name, (t, shape, dtype) in want.items():
        if tuple(t.shape) != shape or t.dtype != dtype:
            raise ValueError(f"{name} must be {list(shape)} {dtype}, got {list(t.shape)} {t.dtype}")
        if t.dim() == 2 and t.stride(1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dimension")
    if model_tokens.dim() != 2 or model_tokens.shape[0] != S or model_tokens.dtype != torch.int64 \
            or model_tokens.stride(1) != 1:
        raise ValueError("model_tokens must be [S, L + 1] int64, contiguous in its last dimension")
    if end_ids.dim() != 1 or end_ids.dtype != torch.int64:
        raise ValueError("end_ids must be a 1-D int64 tensor")


def _bind(backend: str):
    return bind_backend(backend, canvas_commit_reference, "._canvas_commit_triton", "canvas_commit_triton")


def canvas_commit(*args, mask_id: int, eos_id: int, not_new: int, backend: str = "torch") -> torch.Tensor:
    """Checked dispatcher (arguments in the contract's order): "torch" runs the reference, "triton" the kernel."""
    check_canvas_commit_inputs(*args)
    return _bind(backend)(*args, mask_id, eos_id, not_new)


class CanvasCommit:
    """canvas_commit bound to one backend at construction; a call only launches (no checks, no host reads),
    so a decode step built from it can be captured as a CUDA graph."""

    def __init__(self, backend: str):
        self.backend = backend
        self._run = _bind(backend)

    def __call__(self, *args, mask_id: int, eos_id: int, not_new: int) -> torch.Tensor:
        return self._run(*args, mask_id, eos_id, not_new)
