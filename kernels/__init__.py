"""Triton kernels of flash-dllm-chat, one op per file.

Each op module holds a plain-PyTorch reference, a Triton kernel and a dispatcher. The dispatcher takes
``backend``: "triton" (CUDA, or the CPU interpreter when TRITON_INTERPRET=1) or "torch" (the reference).
Nothing here imports model code.
"""
from __future__ import annotations

import os

import torch

BACKENDS = ("triton", "torch")


def interpreting() -> bool:
    """True when Triton runs kernels on the CPU through its interpreter (must be set before import)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except Exception:  # pragma: no cover - triton missing on some platforms
        return False
    return True


def resolve_backend(requested: str | None, device: torch.device | str) -> str:
    """Pick the kernel path: default Triton on CUDA and the torch reference on CPU.

    An explicit "triton" on CPU is honoured only under TRITON_INTERPRET=1 (tests); otherwise it is an error
    with a message that says why, because silently falling back would make `--kernels triton` lie.
    """
    device = torch.device(device)
    if requested in (None, "", "auto"):
        return "triton" if device.type == "cuda" and triton_available() else "torch"
    if requested not in BACKENDS:
        raise ValueError(f"unknown kernel path {requested!r}; choose one of: {', '.join(BACKENDS)}")
    if requested == "triton":
        if not triton_available():
            raise ValueError("--kernels triton: the triton package is not installed")
        if device.type != "cuda" and not interpreting():
            raise ValueError("--kernels triton needs a CUDA device (or TRITON_INTERPRET=1 for the CPU interpreter)")
    return requested
