"""Triton kernel behind `threshold_select` (contract: see threshold_select.py). Grid = (sequences,); a
program holds its row's R candidates in registers."""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _threshold_select_kernel(
    cells_ptr, conf_ptr, tokens_ptr, fb_tokens_ptr, fb_conf_ptr, threshold_ptr,
    chosen_ptr, tokens_out_ptr, conf_out_ptr,
    stride_cells, stride_conf, stride_tokens, stride_fb_tokens, stride_fb_conf,
    R, mask_id, BLOCK_R: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, BLOCK_R)
    in_row = j < R
    valid = (tl.load(cells_ptr + row * stride_cells + j, mask=in_row, other=-1) >= 0) & in_row
    conf = tl.load(conf_ptr + row * stride_conf + j, mask=in_row, other=0.0)
    tokens = tl.load(tokens_ptr + row * stride_tokens + j, mask=in_row, other=0)
    any_valid = tl.max(valid.to(tl.int32), axis=0) > 0

    chosen = valid & (conf >= tl.load(threshold_ptr + row))
    best = tl.argmax(tl.where(valid, conf, -1.0), axis=0, tie_break_left=True)
    nothing_chosen = tl.max(chosen.to(tl.int32), axis=0) == 0
    chosen = chosen | ((j == best) & any_valid & nothing_chosen)

    stuck = tl.max((chosen & (tokens != mask_id)).to(tl.int32), axis=0) == 0
    fb_conf = tl.load(fb_conf_ptr + row * stride_fb_conf + j, mask=in_row, other=0.0)
    fb_best = tl.argmax(tl.where(valid, fb_conf, -1.0), axis=0, tie_break_left=True)
    swap = (j == fb_best) & any_valid & stuck
    fb_tokens = tl.load(fb_tokens_ptr + row * stride_fb_tokens + j, mask=in_row, other=0)
    out = row * R + j
    tl.store(chosen_ptr + out, (chosen | swap).to(tl.int8), mask=in_row)
    tl.store(tokens_out_ptr + out, tl.where(swap, fb_tokens, tokens), mask=in_row)
    tl.store(conf_out_ptr + out, tl.where(swap, fb_conf, conf), mask=in_row)


def threshold_select_triton(cells, confidences, tokens, fallback_tokens, fallback_confidences, threshold,
                            mask_id: int):
    """Launch the kernel; inputs must satisfy the contract (nothing is checked here)."""
    S, R = cells.shape
    chosen = torch.empty((S, R), dtype=torch.bool, device=cells.device)
    tokens_out, conf_out = torch.empty_like(tokens, memory_format=torch.contiguous_format), \
        torch.empty_like(confidences, memory_format=torch.contiguous_format)
    if S == 0 or R == 0:
        return chosen, tokens_out, conf_out
    _threshold_select_kernel[(S,)](
        cells, confidences, tokens, fallback_tokens, fallback_confidences, threshold,
        chosen.view(torch.int8), tokens_out, conf_out,
        cells.stride(0), confidences.stride(0), tokens.stride(0), fallback_tokens.stride(0),
        fallback_confidences.stride(0),
        R, mask_id, BLOCK_R=max(16, triton.next_power_of_2(R)), num_warps=1,
    )
    return chosen, tokens_out, conf_out
