"""Flash-Cache's plan of a step: which positions each sequence recomputes, which cells it reads out, and which
rows score attention mass.

Contract (shared by the reference and the Triton kernel; S sequences, G answer cells, L positions per slot):
    answer       [S, G] int64, -1 where masked          newly_rank [S, G] int64 (NOT_NEW: not committed by the
                                                        previous step, else its commit order, < 2^22)
    attended     [S, T] int64 positions the window attended to most in the previous step, best first (-1: none)
    prompt_len, gen_len, end, steps, max_steps [S] int64 ; official_end, active [S] bool
    window W, lookahead A, track (-1: recompute everything; 0: no tracked tokens), shift (Dream reads cell c's
    logits at position c - 1), slot_len L
Returns FlashCachePlan:
    cells [S, W]: the first W cells still to decode (masked, before the answer's limit, while steps are left),
                  ascending, -1 where there are fewer: the window, whose logits the step reads
    in_query [S, L] bool: on a sequence's first step (or with track -1) every position of the prompt and answer;
                  else the window and the next A cells to decode (look-ahead), with shift the position before
                  each window cell, and the `track` tracked positions (below); nothing for an inactive sequence
    scored [S, L] bool (track > 0, else None): the window's positions
Tracked positions: outside the window/look-ahead set, the cells the previous step committed (by commit order),
then the attended positions (best first), the first `track` of that order.
Exact: integer bookkeeping, the kernel equals the reference bit for bit.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from . import bind_backend

NOT_NEW = 1 << 40
# Tracked-position priorities are float32 (exact integers below 2 ** 24): a float top-k on CUDA runs half the
# radix passes of an int64 one. Newly committed cells rank by commit order (< the answer width), then the i-th
# most attended position at _ATTENDED + i, then _FAR: never tracked.
_ATTENDED = 1 << 22
_FAR = float(1 << 23)


@dataclass(frozen=True)
class PlanShape:
    """A Flash-Cache session's constants."""

    window: int
    lookahead: int
    track: int
    shift: bool
    slot_len: int


@dataclass
class FlashCachePlan:
    cells: torch.Tensor  # [S, W] int64
    in_query: torch.Tensor  # [S, L] bool
    scored: torch.Tensor | None  # [S, L] bool


def first_cells(mask: torch.Tensor, count: int) -> torch.Tensor:
    """[S, count] the first `count` cells where mask is True, ascending, -1 where there are fewer."""
    rank = torch.cumsum(mask.long(), 1) - 1
    target = torch.where(mask & (rank < count), rank, count)
    out = torch.full((mask.shape[0], count + 1), -1, dtype=torch.int64, device=mask.device)
    out.scatter_(1, target, torch.arange(mask.shape[1], device=mask.device).expand_as(target))
    return out[:, :count]


def flags_at(positions: torch.Tensor, width: int) -> torch.Tensor:
    """[S, width + 1] bool, True at every entry of positions [S, K] (values in [0, width]; `width` = none, and
    column `width` is a dump the caller slices off)."""
    out = torch.zeros((positions.shape[0], width + 1), dtype=torch.bool, device=positions.device)
    return out.scatter_(1, positions, True)


def still_to_decode(answer, gen_len, end, official_end, steps, max_steps) -> torch.Tensor:
    """[S, G] cells still to decode: masked, before the limit (the answer's end, or the end token's cell + 1 under
    the stop rule), while the schedule has steps left."""
    limit = torch.where(official_end, gen_len, torch.minimum(end + 1, gen_len))
    cells = torch.arange(answer.shape[1], device=answer.device)[None, :]
    return (answer < 0) & (cells < limit[:, None]) & (steps < max_steps)[:, None]


def tracked_positions(newly_rank, attended, prompt_len, chosen: torch.Tensor, track: int) -> torch.Tensor:
    """[S, track] positions (L = none), unsorted: the `track` positions of highest priority outside `chosen`
    ([S, L] bool), the previous step's commits in commit order, then the attended positions best first."""
    S, L = chosen.shape
    prio = torch.full((S, L + 1), _FAR, dtype=torch.float32, device=chosen.device)
    rank = torch.arange(attended.shape[1], dtype=torch.float32, device=chosen.device) + _ATTENDED
    prio.scatter_(1, torch.where(attended >= 0, attended, L), rank.expand_as(attended).contiguous())
    cells = torch.arange(newly_rank.shape[1], device=chosen.device)[None, :]
    new_pos = torch.where(newly_rank < NOT_NEW, prompt_len[:, None] + cells, L)  # others land in the dump column
    prio.scatter_(1, new_pos, newly_rank.to(torch.float32))
    prio = prio[:, :L].masked_fill(chosen, _FAR)
    values, index = torch.topk(prio, min(track, L), dim=1, largest=False, sorted=False)
    return torch.where(values < _FAR, index, L)


def flash_cache_plan_reference(answer, newly_rank, attended, prompt_len, gen_len, end, official_end, steps,
                               max_steps, active, shape: PlanShape) -> FlashCachePlan:
    """Tensor operations: position sets are built as [S, L + 1] flags scattered at positions (L = none)."""
    L, p0 = shape.slot_len, prompt_len[:, None]
    masked = still_to_decode(answer, gen_len, end, official_end, steps, max_steps)
    ahead_and_window = first_cells(masked, shape.window + shape.lookahead)
    window = ahead_and_window[:, : shape.window]
    at = torch.where(ahead_and_window >= 0, p0 + ahead_and_window, L)
    if shape.shift:  # Dream reads cell c's logits at position c - 1 (none before position 0)
        before = p0 + window - 1
        at = torch.cat([at, torch.where((window >= 0) & (before >= 0), before, L)], dim=1)
    chosen = flags_at(at, L)
    if shape.track > 0:
        chosen.scatter_(1, tracked_positions(newly_rank, attended, prompt_len, chosen[:, :L], shape.track), True)
    chosen = chosen[:, :L]
    everything = torch.arange(L, device=answer.device)[None, :] < (prompt_len + gen_len)[:, None]
    if shape.track < 0:
        in_query = everything
    else:  # a sequence's first step reads everything
        in_query = torch.where((steps == 0)[:, None], everything, chosen)
    scored = None
    if shape.track > 0:
        scored = flags_at(torch.where(window >= 0, p0 + window, L), L)[:, :L]
    return FlashCachePlan(cells=window, in_query=in_query & active[:, None], scored=scored)


class FlashCachePlanOp:
    """flash_cache_plan bound to one backend at construction ("triton": one kernel launch; "torch": the
    reference). A call only launches, so a step built from it can be captured as a CUDA graph."""

    def __init__(self, backend: str):
        self.backend = backend
        self._run = bind_backend(backend, flash_cache_plan_reference, "._flash_cache_plan_triton",
                                 "flash_cache_plan_triton")

    def __call__(self, answer, newly_rank, attended, prompt_len, gen_len, end, official_end, steps, max_steps,
                 active, shape: PlanShape) -> FlashCachePlan:
        return self._run(answer, newly_rank, attended, prompt_len, gen_len, end, official_end, steps, max_steps,
                         active, shape)
