"""Triton helpers shared by the decode step's bookkeeping kernels (Flash-Cache's plan, Fast-dLLM's block schedule,
Flash-Verify's pass): the canvas's rule of which cells are still to decode, read once per sequence, and a scalar
flag as a vector mask. Their torch form is `flash_cache_plan.still_to_decode`."""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def flag(value, like):
    """An int32 0/1 scalar as a bool vector shaped like `like` (the interpreter refuses scalar bools in masks)."""
    return (like * 0 + value) != 0


@triton.jit
def decode_limits(row, gen_len_ptr, end_ptr, official_end_ptr, steps_ptr, max_steps_ptr):
    """Sequence `row`'s answer length, the cell limit (cells at or past it are padding or outside the answer:
    gen_len under the official end rule, else one past the end token) and whether its schedule has steps left
    (int32 0/1). A cell is still to decode when it is masked, below the limit, and the sequence is live."""
    gen_len = tl.load(gen_len_ptr + row)
    official = tl.load(official_end_ptr + row) != 0
    limit = tl.where(official, gen_len, tl.minimum(tl.load(end_ptr + row) + 1, gen_len))
    live = (tl.load(steps_ptr + row) < tl.load(max_steps_ptr + row)).to(tl.int32)
    return gen_len, limit, live
