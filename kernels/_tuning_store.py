"""Tuned kernel choices kept on disk, so a new process (each app start) does not time the candidates again.

A choice is stored under a digest of everything that could change the answer: this file format, the torch and
Triton versions, the GPU's name and compute capability, the source of the kernels that were timed, the problem
and the candidates. Anything else (a different GPU, an edited kernel, a new config list) is a miss and is timed
afresh. A file that cannot be read or does not name one of the candidates is a miss too, never an error.

The directory is Triton's kernel cache (`TRITON_CACHE_DIR`, default ~/.triton/cache) under `flash_dllm_tuning`:
deleting it re-tunes, as deleting the cache recompiles.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import tempfile
from pathlib import Path

import torch
import triton
import triton.runtime.errors as triton_errors

FORMAT = "flash-dllm-tuning-1"
SUBDIR = "flash_dllm_tuning"
# What a candidate config that does not fit this GPU raises (shared memory, registers): a tuner skips it.
DOES_NOT_FIT = tuple(getattr(triton_errors, name) for name in ("OutOfResources", "PTXASError")
                     if hasattr(triton_errors, name))


def default_directory() -> Path:
    knobs = getattr(triton, "knobs", None)  # triton before 3.4 has none: its cache directory by the same rule
    base = knobs.cache.dir if knobs is not None else (
        os.environ.get("TRITON_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".triton", "cache"))
    return Path(base) / SUBDIR


@functools.lru_cache(maxsize=None)
def source_digest(*paths: str) -> str:
    """sha256 over the bytes of these files (the kernels a choice was timed on)."""
    digest = hashlib.sha256()
    for path in paths:
        digest.update(Path(path).read_bytes())
    return digest.hexdigest()


def device_description(device: torch.device) -> str:
    """The GPU a timing belongs to (name and compute capability), or the device type off CUDA."""
    if device.type != "cuda":
        return device.type
    index = device.index if device.index is not None else torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(index)
    return f"{torch.cuda.get_device_name(index)} sm_{major}{minor}"


class TuningStore:
    """One directory of stored choices. `load` and `save` take a list of strings that identify the problem
    (see the module docstring for what callers put in it) and a JSON-able payload."""

    def __init__(self, directory: str | os.PathLike | None = None):
        self.directory = Path(directory) if directory is not None else default_directory()

    def _file(self, name: str, key_parts: list[str]) -> Path:
        parts = [FORMAT, torch.__version__, triton.__version__, *key_parts]
        digest = hashlib.sha256("\x1f".join(parts).encode()).hexdigest()
        return self.directory / f"{name}-{digest[:32]}.json"

    def load(self, name: str, key_parts: list[str]) -> dict | None:
        try:
            with open(self._file(name, key_parts), encoding="utf-8") as handle:
                payload = json.load(handle)
        except (OSError, ValueError):
            return None
        return payload if isinstance(payload, dict) else None

    def save(self, name: str, key_parts: list[str], payload: dict) -> None:
        """Written whole or not at all (a temporary file renamed over the old one); a directory that cannot be
        written (read-only home, full disk) only costs the next process its tuning."""
        path, tmp = self._file(name, key_parts), None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(payload, handle)
            os.replace(tmp, path)
        except OSError:
            if tmp is not None:  # a full disk: leave no half-written file behind
                Path(tmp).unlink(missing_ok=True)


@functools.lru_cache(maxsize=1)
def default_store() -> TuningStore:
    """The store every tuner shares: Triton's cache directory as it is on first use."""
    return TuningStore()


def matching_config(stored: dict, candidates: tuple):
    """The candidate whose fields equal a stored config's, or None."""
    for candidate in candidates:
        if dataclasses.asdict(candidate) == stored:
            return candidate
    return None

