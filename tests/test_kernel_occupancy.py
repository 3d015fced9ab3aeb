"""Occupancy (programs per SM) from a compiled kernel's resources, against the CUDA programming guide's limits.

The numbers are the scheduled attention split kernel's, compiled on the CPU for sm_86 and sm_90 (Triton 3.7,
the candidates of `_scheduled_attention_triton._CUDA_CANDIDATES`, registers from cuobjdump)."""
from types import SimpleNamespace

import pytest
import torch

from flash_dllm.kernels import _occupancy
from flash_dllm.kernels._occupancy import LIMITS_BY_CAPABILITY, SmLimits, programs_per_sm, sm_limits

RTX_3090, HOPPER = LIMITS_BY_CAPABILITY[(8, 6)], LIMITS_BY_CAPABILITY[(9, 0)]


@pytest.mark.parametrize("shared, registers, warps, holds", [
    (36864, 255, 4, 2),  # BLOCK_N 32, 2 stages: the candidate that fits twice (2 x 37 KB; 255 x 128 x 2 registers)
    (53248, 168, 4, 1),  # BLOCK_N 32, 3 stages: 2 x (52 + 1) KB > 100 KB
    (90112, 184, 4, 1),
    (98304, 255, 4, 1),  # BLOCK_N 128, 2 stages: the largest that fits at all
])
def test_rtx_3090_occupancy(shared, registers, warps, holds):
    assert programs_per_sm(shared, registers, warps, RTX_3090) == holds


@pytest.mark.parametrize("shared, registers, warps, holds", [
    (65536, 145, 4, 3),  # BLOCK_N 32, 3 stages: 3 x 65 KB by shared memory, 3 by registers (152 each)
    (114688, 202, 4, 2),  # BLOCK_N 64, 3 stages (the H200's tuned choice): 2 x 113 KB of 228
    (98560, 255, 4, 2),  # the same with the attention mass: 255 registers x 128 threads fit twice in 64 K
    (147456, 255, 4, 1),  # BLOCK_N 128, 2 stages
    (0, 255, 8, 1),  # 8 warps at 255 registers: 64 K registers hold one block
    (0, 40, 4, 12),  # no shared memory, few registers: the 2048-thread limit
    (0, 0, 1, 32),  # registers unknown (0) are not counted; the 32-block limit
])
def test_hopper_occupancy(shared, registers, warps, holds):
    assert programs_per_sm(shared, registers, warps, HOPPER) == holds


def test_registers_are_allocated_per_warp_in_256s():
    one_sm = SmLimits(10**9, 65536, 4096, 64)
    assert programs_per_sm(0, 64, 4, one_sm) == 8  # 64 x 32 = 2048 per warp: 32 warps
    assert programs_per_sm(0, 65, 4, one_sm) == 7  # 65 x 32 = 2080, rounded up to 2304 per warp: 28 warps
    assert programs_per_sm(10**9, 0, 4, one_sm) == 1  # never below one: a kernel that launched fits once


def test_sm_limits_from_torch_then_from_the_table(monkeypatch):
    props = SimpleNamespace(major=8, minor=6, shared_memory_per_multiprocessor=102400, regs_per_multiprocessor=65536,
                            max_threads_per_multi_processor=1536)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: props)
    assert sm_limits(torch.device("cuda")) == RTX_3090
    older = SimpleNamespace(major=9, minor=0)  # a torch that reports none of the three
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: older)
    assert sm_limits(torch.device("cuda")) == HOPPER
    unknown = SimpleNamespace(major=7, minor=5)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: unknown)
    assert sm_limits(torch.device("cuda")) is None


def test_compiled_kernel_occupancy_loads_the_binary_first(monkeypatch):
    """n_regs exists only once Triton has loaded the binary (`_init_handles`)."""
    monkeypatch.setattr(_occupancy, "sm_limits", lambda device: HOPPER)

    class Compiled:
        metadata = SimpleNamespace(shared=114688, num_warps=4)

        def _init_handles(self):
            self.n_regs = 255

    assert _occupancy.compiled_programs_per_sm(Compiled(), torch.device("cuda")) == 2
    monkeypatch.setattr(_occupancy, "sm_limits", lambda device: None)
    assert _occupancy.compiled_programs_per_sm(Compiled(), torch.device("cuda")) is None
