"""The loaded engine and how the page switches it: cached models, downloads with progress, a fit check first.

One engine is loaded at a time. `ModelHost.gpu` is held by a generation and by the load of a switch, so a
switch waits for the answer being decoded and never runs two models on the GPU at once. Everything that
talks to the network (the Hub's file list, a download) happens before that lock is taken: a slow or stalled
Hub delays only the switch that asked, never anyone's chat.

On a shared app (a share link, or listening beyond this machine) `ModelHost.shelf_only` limits loads to the
models the page lists (bundled and cached ones) and downloads to Hugging Face repo ids: a visitor can name no
server path, and no error tells them which paths exist.

API requests (app/api.py) do not take `gpu`: they hold a `Lease` on the engine for as long as they decode, and
a switch waits for every lease to end (new ones are refused meanwhile), so a model is never unloaded under a
request nor two models kept in memory by one.
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


class ModelBusy(RuntimeError):
    """No engine to lend now: none is loaded, or the loaded one is being switched."""


@dataclass
class Lease:
    """An API request's hold on the loaded engine; `release` (idempotent) lets a waiting switch go on."""

    engine: Engine
    name: str
    _host: "ModelHost"
    _released: bool = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._host._end_lease()


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


# One line shown beside a bundled model (in the model list and the banner), so that nobody mistakes a demo
# model for a general assistant. Keyed by the bundled folder's name; other models get no line.
BUNDLED_PURPOSES = {
    "tiny-chat": "a 19M-parameter demo model: small arithmetic, lists, short word problems",
    "tiny-cpu": "a 1M-parameter test model for quick checks, not for chatting",
}


# How many earlier exchanges a bundled model reads before the last question. tiny-chat was trained on chats of
# at most four exchanges before the question; after many more turns its answers drift, while a follow-up
# ("now double it") needs only the exchange before it. Models not listed read as much as their context holds.
BUNDLED_HISTORY = {"tiny-chat": 3}


def bundled_name(model: str | None) -> str:
    """The bundled model's name when ``model`` (a name, a folder, or `bundled` as the command line takes it) is a
    bundled model, else ""."""
    if model == "bundled":
        default = hub.bundled_model_path()
        return default.name if default is not None and default.name in BUNDLED_PURPOSES else ""
    name = Path(model).name if model else ""
    if name not in BUNDLED_PURPOSES:
        return ""
    path = Path(model).expanduser()
    if not path.is_dir():
        return name if model == name else ""  # the bundled model named, not a folder
    bundled = hub.bundled_model_path()
    same = bundled is not None and path.resolve().parent == bundled.resolve().parent
    return name if same else ""  # a folder of the same name elsewhere is another model


def model_id(name: str | None, folder: str | Path | None = None) -> str:
    """The id the API gives the model loaded as ``name`` from ``folder``: a bundled model by its own name, however
    the command line named it (`bundled`, its name, its folder), so that clients see one id; any other model as
    `display_name`."""
    return bundled_name(str(folder) if folder else name) or display_name(name)


def model_names(name: str | None, folder: str | Path | None = None) -> set[str]:
    """The names a client may give the model loaded as ``name`` from ``folder``: the id the API lists
    (`model_id`) and the name it was loaded by; for a bundled model also the names the command line takes for
    it (`hub.resolve_model`): its folder's name, its folder, and `bundled` for the default one. So
    `--model bundled` and an API request for "bundled" mean the same model."""
    names = {display_name(name), model_id(name, folder)} | ({name} if name else set())
    bundled = bundled_name(str(folder) if folder else name)
    if bundled:
        names |= {bundled} | ({str(folder)} if folder else set())
        if bundled_name("bundled") == bundled:  # the default bundled model
            names.add("bundled")
    return names


def model_purpose(model: str | None) -> str:
    """The purpose line of a bundled model ("" for any other): ``model`` is its name or its folder."""
    return BUNDLED_PURPOSES.get(bundled_name(model), "")


def history_exchanges(model: str | None) -> int | None:
    """How many earlier exchanges the page sends with a question to ``model`` (None: all that fit)."""
    return BUNDLED_HISTORY.get(bundled_name(model))


@dataclass(frozen=True)
class LoadOptions:
    """How every model of this app is loaded (the launcher's flags): `Engine.load`'s keywords."""

    device: str | None = None  # None / "auto": the engine's default
    dtype: str | None = None
    kernels: str | None = None
    graphs: bool = True


class ModelHost:
    def __init__(self, engine: Engine | None = None, options: LoadOptions = LoadOptions(), name: str | None = None,
                 shelf_only: bool = False):
        self.engine = engine
        self.name = name or (engine.name if engine is not None else None)
        self.options = options
        self.shelf_only = shelf_only
        self.folder = str(engine.folder) if engine is not None else None  # where the loaded model was read from
        self.gpu = threading.Lock()
        self._leases = 0
        self._switching = False
        self._leases_changed = threading.Condition()
        self.request_labels: dict[int, str] = {}  # engine request id -> who asked ("API", "page"), for the page

    # ------------------------------------------------------------------ lending the engine to API requests
    def lease(self) -> Lease:
        """The loaded engine for one request; ModelBusy while none is loaded or a switch is under way."""
        with self._leases_changed:
            if self._switching:
                raise ModelBusy(f"the model is being switched (from {display_name(self.name)}); try again shortly")
            if self.engine is None:
                raise ModelBusy("no model is loaded")
            self._leases += 1
            return Lease(self.engine, self.name, self)

    def _end_lease(self) -> None:
        with self._leases_changed:
            self._leases -= 1
            self._leases_changed.notify_all()

    def _wait_for_leases(self) -> None:
        """Refuse new leases and wait until the lent ones end (the requests they serve finish)."""
        with self._leases_changed:
            self._switching = True
            self._leases_changed.wait_for(lambda: self._leases == 0)

    def label(self, request_id: int, who: str) -> None:
        """Remember who asked for an engine request; labels of requests no longer in flight are dropped."""
        live = {info.id for info in self.engine.requests_in_flight()} if self.engine is not None else set()
        self.request_labels = {k: v for k, v in self.request_labels.items() if k in live}
        self.request_labels[request_id] = who

    # ------------------------------------------------------------------ what there is
    def describe(self) -> dict:
        """The engine's description, with the model named for display (`model_id`: the bundled model by its own
        name however it was loaded, another by `display_name`)."""
        if self.engine is None:
            return {}
        info = dict(self.engine.describe())
        info["model"] = model_id(str(info.get("model", "")), getattr(self.engine, "folder", None))
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
            purpose = model_purpose(str(cached.path)) if "/" not in cached.name else ""
            label += f" · {purpose}" if purpose else ""
            out.append(ModelChoice(label, value, cached.size_bytes))
            seen.add(value)
        if self.name and self.name not in seen:
            out.insert(0, ModelChoice(f"{Path(self.name).name} (loaded)", self.name, 0))
        return out

    def check_allowed(self, name: str, download: bool = False) -> str:
        """``name`` stripped, or ModelError when this app may not load it (see the module docstring)."""
        name = (name or "").strip() if isinstance(name, str) else ""
        if not name:
            raise ModelError("choose a model or type a Hugging Face repo id (org/name)")
        if self.shelf_only:
            if download and not hub.REPO_ID.match(name):
                raise ModelError("type a Hugging Face repo id such as GSAI-ML/LLaDA-8B-Instruct")
            if not download and name not in {choice.value for choice in self.choices()}:
                raise ModelError("on a shared app only the models listed under Model can be loaded")
        return name

    # ------------------------------------------------------------------ switching
    def weight_bytes(self, repo_id: str) -> int:
        """The repo's safetensors bytes from the Hub's file list (before downloading; network, no lock)."""
        name = self.check_allowed(repo_id, download=True)
        try:
            return hub.remote_weight_bytes(name)
        except hub.HubError as err:
            raise ModelError(str(err)) from None

    def fetch(self, name: str, progress: Callable[[int, int], None] | None = None, download: bool = False) -> Path:
        """The model's folder: a folder or bundled model as is, a repo id from the cache or downloaded now.
        Network only, never under `gpu`; ModelError with one line when it cannot be had."""
        name = self.check_allowed(name, download)
        try:
            if download or (self.shelf_only and hub.REPO_ID.match(name)):
                return hub.pull(name, progress)  # a repo id, never read as a path
            return hub.resolve_model(name, progress)
        except (hub.HubError, ValueError, OSError) as err:
            raise ModelError(" ".join(str(err).split())) from None

    def _unload(self) -> None:
        self.engine = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def switch(self, name: str, progress: Callable[[int, int], None] | None = None, download: bool = False) -> Engine:
        """Load ``name`` (a folder, a bundled model or a repo id; downloaded when needed, before the lock) in
        place of the current model. Refuses with the numbers when the weights do not fit the device's free
        memory (after the current model is unloaded); the previous model is then loaded again."""
        name = self.check_allowed(name, download)
        if name == self.name and self.engine is not None:
            return self.engine
        return self.load_folder(self.fetch(name, progress, download), name)

    def load_folder(self, folder: Path, name: str) -> Engine:
        """Load a fetched model folder as ``name`` under `gpu` (waits for the answer being decoded)."""
        size = hub.remote_weight_bytes(str(folder))  # a local folder: no network
        device = self.target_device()
        with self.gpu:
            self._wait_for_leases()
            try:
                return self._switch_locked(folder, name, size, device)
            finally:
                with self._leases_changed:
                    self._switching = False

    def _switch_locked(self, folder: Path, name: str, size: int, device) -> Engine:
        """Unload the current model and load ``folder`` (under `gpu`, with no lease out)."""
        previous = (self.folder, self.name) if self.folder else None
        ok, message = hub.fit_check(size, device, self.options.dtype)
        if not ok and self.engine is not None:
            self._unload()  # the current model's memory counts as free for the new one
            ok, message = hub.fit_check(size, device, self.options.dtype)
        if not ok:
            if self.engine is None and previous:
                self._load_locked(*previous)
            raise ModelError(f"{name} {message}")
        self._unload()
        try:
            return self._load_locked(str(folder), name)
        except Exception as err:
            reason = f"{type(err).__name__}: {err}" if not isinstance(err, (hub.HubError, ValueError)) else str(err)
            if previous:
                try:
                    self._load_locked(*previous)
                except Exception as again:  # pragma: no cover - the previous model loaded before
                    reason += f"; reloading {previous[1]} failed too: {again}"
            raise ModelError(f"could not load {name}: {' '.join(reason.split())}") from None

    def _load_locked(self, folder: str, name: str) -> Engine:
        """Load from a local folder (never a download: this runs under `gpu`)."""
        self.engine = Engine.load(folder, name=name, **asdict(self.options))
        self.name, self.folder = name, folder
        try:
            paths.remember_model(name)
        except OSError:
            pass  # a read-only config folder must not stop the model from loading
        return self.engine


def known_models(card_gib: float = 24.0) -> list[ModelChoice]:
    """The published checkpoints the app knows, to offer for download, each labelled with its bf16 size and
    whether it fits a card of ``card_gib`` GiB (there is no quantised mode yet)."""
    out = []
    for fit in hub.known_model_fits(card_gib):
        verdict = "fits" if fit.fits else "does not fit"
        label = (f"{fit.repo} ({format_bytes(fit.weight_bytes)} bf16, {fit.family}; {verdict} a {card_gib:g} GiB "
                 f"card, needs about {fit.need_bytes / hub.GIB:.0f} GiB)")
        out.append(ModelChoice(label, fit.repo, fit.weight_bytes))
    return out


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
