"""What both kernel test modules share: where the kernels run, the tolerances, the error measure."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported (conftest does the same)

import pytest  # noqa: E402
import torch  # noqa: E402

from flash_dllm.kernels import interpreting  # noqa: E402

DEVICE = "cpu" if interpreting() else ("cuda" if torch.cuda.is_available() else None)
needs_triton = pytest.mark.skipif(DEVICE is None, reason="Triton needs TRITON_INTERPRET=1 or a CUDA device")
needs_gpu = pytest.mark.skipif(DEVICE != "cuda", reason="full model shapes run on a CUDA device only")

TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    expected = expected.double()
    return ((actual.double() - expected).norm() / expected.norm().clamp_min(1e-30)).item()
