"""How many programs of a compiled kernel one SM holds at once (its occupancy, in thread blocks).

A schedule that sizes its grid to fill the GPU (the attention's key splits) needs this number: an RTX 3090's SM
has 100 KB of shared memory where a Hopper SM has 228 KB, so the same kernel config fits twice per SM on one and
once on the other. The limits come from the device properties where torch reports them, otherwise from the
CUDA programming guide's table for the compute capability.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

RESERVED_SHARED_BYTES = 1024  # the CUDA runtime's own shared memory per block, on sm_80 and later
SHARED_GRANULE = 128  # shared memory is allocated per block in these units
REGISTER_GRANULE = 256  # registers are allocated per warp in these units


@dataclass(frozen=True)
class SmLimits:
    """What one streaming multiprocessor holds at once."""

    shared_bytes: int  # shared memory per SM, all blocks together
    registers: int  # 32-bit registers per SM
    threads: int  # resident threads per SM
    blocks: int  # resident thread blocks per SM


# The programming guide's per-SM limits (Table "Technical Specifications per Compute Capability").
LIMITS_BY_CAPABILITY = {
    (8, 0): SmLimits(167936, 65536, 2048, 32),  # A100
    (8, 6): SmLimits(102400, 65536, 1536, 16),  # RTX 30xx, A6000
    (8, 7): SmLimits(167936, 65536, 2048, 16),  # Jetson Orin
    (8, 9): SmLimits(102400, 65536, 1536, 24),  # RTX 40xx, L4, L40
    (9, 0): SmLimits(233472, 65536, 2048, 32),  # H100, H200
}


def sm_limits(device: torch.device) -> SmLimits | None:
    """The SM limits of a CUDA device; None when neither torch nor the table knows them."""
    props = torch.cuda.get_device_properties(device)
    known = LIMITS_BY_CAPABILITY.get((props.major, props.minor))
    shared = getattr(props, "shared_memory_per_multiprocessor", None) or (known and known.shared_bytes)
    registers = getattr(props, "regs_per_multiprocessor", None) or (known and known.registers)
    threads = getattr(props, "max_threads_per_multi_processor", None) or (known and known.threads)
    blocks = known.blocks if known else 16  # not in torch's properties; 16 is the lowest of recent GPUs
    if not (shared and registers and threads):
        return None
    return SmLimits(int(shared), int(registers), int(threads), blocks)


def programs_per_sm(shared_bytes: int, registers_per_thread: int, num_warps: int, limits: SmLimits,
                    warp_size: int = 32) -> int:
    """Thread blocks of this size one SM holds at once: the least of what its shared memory, registers, threads
    and block slots allow (at least 1: a kernel that launched fits once). registers_per_thread 0 = unknown (not
    counted)."""
    fits = [limits.blocks, limits.threads // (num_warps * warp_size)]
    block_shared = -(-(shared_bytes + RESERVED_SHARED_BYTES) // SHARED_GRANULE) * SHARED_GRANULE
    fits.append(limits.shared_bytes // block_shared)
    if registers_per_thread:
        per_warp = -(-(registers_per_thread * warp_size) // REGISTER_GRANULE) * REGISTER_GRANULE
        fits.append(limits.registers // per_warp // num_warps)
    return max(1, min(fits))


def compiled_programs_per_sm(compiled, device: torch.device) -> int | None:
    """programs_per_sm of a Triton CompiledKernel on this device; None when its resources cannot be read."""
    limits = sm_limits(device)
    if limits is None:
        return None
    compiled._init_handles()  # loads the binary: the register count is known from here on
    return programs_per_sm(compiled.metadata.shared, getattr(compiled, "n_regs", 0) or 0,
                           compiled.metadata.num_warps, limits)
