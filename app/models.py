"""The loaded engine and how the page switches it: cached models, downloads with progress, a fit check first.

One engine is loaded at a time. `ModelHost.gpu` is held by a generation and by a switch, so a switch waits
for the answer being decoded and never runs two models on the GPU at once.
"""
from __future__ import annotations

import gc
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch

from flash_dllm.app import paths
from flash_dllm.app.stats import format_bytes
from flash_dllm.engine import Engine, hub, pick_device


class ModelError(RuntimeError):
    """A model that cannot be loaded here; the message is one line with the numbers."""


@dataclass
class ModelChoice:
    label: str
    value: str  # what Engine.load / hub.resolve_model accept
    size_bytes: int


def display_name(model: str | None) -> str:
    """How the page names a model: a repo id as is, a local folder by its folder name."""
    if not model:
        return "no model loaded"
    path = Path(model).expanduser()
    return path.name if path.is_dir() else model


@dataclass(frozen=True)
class LoadOptions:
    """How every model of this app is loaded (the launcher's flags): `Engine.load`'s keywords."""

    device: str | None = None  # None / "auto": the engine's default
    dtype: str | None = None
    kernels: str | None = None
    graphs: bool = True


class ModelHost:
    def __init__(self, engine: Engine | None = None, options: LoadOptions = LoadOptions(), name: str | None = None):
        self.engine = engine
        self.name = name or (engine.name if engine is not None else None)
        self.options = options
        self.gpu = threading.Lock()

    # ------------------------------------------------------------------ what there is
    def describe(self) -> dict:
        """The engine's description, with the model named for display (see `display_name`)."""
        if self.engine is None:
            return {}
        info = dict(self.engine.describe())
        info["model"] = display_name(str(info.get("model", "")))
        return info

    def target_device(self) -> torch.device:
        if self.engine is not None:
            return self.engine.device
        return pick_device(self.options.device)

    def choices(self) -> list[ModelChoice]:
        """The loaded model, the bundled models and every complete model in the HF cache."""
        seen, out = set(), []
        for cached in hub.list_cached_models():
            value = cached.name if "/" in cached.name else str(cached.path)
            label = f"{cached.name} ({format_bytes(cached.size_bytes)}, {cached.family})"
            out.append(ModelChoice(label, value, cached.size_bytes))
            seen.add(value)
        if self.name and self.name not in seen:
            out.insert(0, ModelChoice(f"{Path(self.name).name} (loaded)", self.name, 0))
        return out

    # ------------------------------------------------------------------ switching
    def weight_bytes(self, name: str) -> int:
        try:
            return hub.remote_weight_bytes(name)
        except hub.HubError as err:
            raise ModelError(str(err)) from None

    def _unload(self) -> None:
        self.engine = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def switch(self, name: str, progress: Callable[[int, int], None] | None = None,
               weight_bytes: int | None = None) -> Engine:
        """Load ``name`` (a folder, a bundled model or a repo id; downloaded when needed) in place of the
        current model. Refuses with the numbers when the weights do not fit the device's free memory (after
        the current model is unloaded); the previous model is then loaded again."""
        name = (name or "").strip()
        if not name:
            raise ModelError("choose a model or type a Hugging Face repo id (org/name)")
        size = self.weight_bytes(name) if weight_bytes is None else weight_bytes
        device = self.target_device()
        with self.gpu:
            if name == self.name and self.engine is not None:
                return self.engine
            previous = self.name
            ok, message = hub.fit_check(size, device, self.options.dtype)
            if not ok and self.engine is not None:
                self._unload()  # the current model's memory counts as free for the new one
                ok, message = hub.fit_check(size, device, self.options.dtype)
            if not ok:
                if self.engine is None and previous:
                    self._load_locked(previous, None)
                raise ModelError(f"{name} {message}")
            self._unload()
            try:
                return self._load_locked(name, progress)
            except Exception as err:
                reason = f"{type(err).__name__}: {err}" if not isinstance(err, (hub.HubError, ValueError)) else str(err)
                if previous:
                    try:
                        self._load_locked(previous, None)
                    except Exception as again:  # pragma: no cover - the previous model loaded before
                        reason += f"; reloading {previous} failed too: {again}"
                raise ModelError(f"could not load {name}: {reason}") from None

    def _load_locked(self, name: str, progress) -> Engine:
        self.engine = Engine.load(name, progress=progress, **asdict(self.options))
        self.name = name
        try:
            paths.remember_model(name)
        except OSError:
            pass  # a read-only config folder must not stop the model from loading
        return self.engine


def startup_model(requested: str | None) -> tuple[str | None, str]:
    """Which model the app starts with, and why: ``--model``; else the last model used if it is still on
    disk; else, with a GPU, the first downloaded model; else (no GPU, or nothing downloaded) the bundled one."""
    if requested:
        return requested, "from --model"
    cached = hub.list_cached_models()
    local = {c.name for c in cached} | {str(c.path) for c in cached}
    last = paths.last_model()
    if last and (last in local or Path(last).expanduser().is_dir()):
        return last, "the last model used"
    bundled = hub.bundled_model_path()
    downloaded = [c for c in cached if "/" in c.name]
    if torch.cuda.is_available() and downloaded:
        return downloaded[0].name, "downloaded model"
    if bundled is not None:
        why = "no GPU" if not torch.cuda.is_available() else "no downloaded model"
        return str(bundled), f"the bundled model ({why})"
    return None, "no model: pass --model ORG/NAME or a model folder"
