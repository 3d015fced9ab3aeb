"""Model sources: local folders, the bundled tiny models, and Hugging Face repos in the standard HF cache.

Environment, read at call time (huggingface_hub reads it once at import, which would pin a long-running app
or a test session to whatever was set first): HF_ENDPOINT, HF_HOME / HF_HUB_CACHE, HF_HUB_OFFLINE, HF_TOKEN.

A pull (1) asks the Hub for the file list with sizes (and stops there when that commit is already cached),
(2) fetches config.json alone and refuses an unsupported model before any weight moves, (3) downloads the
safetensors with engine.download (resumable across runs), then (4) lets huggingface_hub's snapshot_download
fetch the small files and link everything into the cache's snapshot.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from flash_dllm.engine.config import SUPPORTED, UnsupportedModelError, load_config
from flash_dllm.engine.download import (DownloadError, fetch_weights, install_timeouts, network_errors,
                                        network_timeout_s, repo_storage, silent_tqdm)

ALLOW_PATTERNS = [
    "config.json", "generation_config.json", "*.safetensors", "model.safetensors.index.json", "tokenizer.json",
    "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt", "added_tokens.json",
    "chat_template.jinja",
]  # never *.bin / *.pt: pickles can run code when loaded, and the engine reads safetensors only
# org/name as the Hub spells them: no "..", no leading dot, so a repo id is never also a relative path upward
REPO_ID = re.compile(r"^(?!.*\.\.)[A-Za-z0-9][\w.-]*/[A-Za-z0-9_][\w.-]*$")
DEFAULT_ENDPOINT = "https://huggingface.co"
REVISION = "main"
GIB = 1024**3

Progress = Callable[[int, int], None]


class HubError(RuntimeError):
    """A model that cannot be found, fetched or used; the message is one line that says what to do."""


@dataclass
class CachedModel:
    name: str  # repo id ("org/name") or the bundled model's folder name
    path: Path
    size_bytes: int  # safetensors bytes
    family: str


@dataclass(frozen=True)
class HubEnv:
    endpoint: str
    cache_dir: Path
    offline: bool
    token: str | None

    @classmethod
    def current(cls) -> "HubEnv":
        home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
        cache = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE") or os.path.join(home, "hub")
        offline = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
        return cls(
            endpoint=(os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/"),
            cache_dir=Path(os.path.expandvars(os.path.expanduser(cache))),
            offline=offline.strip().upper() in ("1", "ON", "YES", "TRUE"),
            token=os.environ.get("HF_TOKEN") or None,  # None: huggingface_hub falls back to a saved login
        )

    def activate(self) -> None:
        """huggingface_hub blocks every request while its import-time offline flag is set; make that flag
        follow the environment of this call."""
        from huggingface_hub import constants

        constants.HF_HUB_OFFLINE = self.offline
        install_timeouts()  # a stalled Hub fails a call instead of hanging it

    def storage(self, repo_id: str) -> Path:
        return repo_storage(self.cache_dir, repo_id)


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return text if len(text) <= 200 else text[:197] + "..."


def _hub_error(repo_id: str, err: Exception, env: HubEnv) -> HubError:
    """A one-line message for an answer of the Hub (missing repo, gated, server error)."""
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    if isinstance(err, GatedRepoError):
        return HubError(f"{repo_id} is gated: accept its licence on the Hub, then set HF_TOKEN")
    if isinstance(err, RepositoryNotFoundError):
        return HubError(f"{repo_id}: no such model on {env.endpoint} (or it is private: set HF_TOKEN)")
    if isinstance(err, RevisionNotFoundError):
        return HubError(f"{repo_id} has no revision {REVISION!r} on {env.endpoint}")
    status = getattr(getattr(err, "response", None), "status_code", None)
    return HubError(f"{env.endpoint} answered {status or 'an error'} for {repo_id}: {_one_line(err)}")


# ---- cache ---------------------------------------------------------------------------------------------------
def _check_model_folder(folder: Path, label: str) -> str:
    """The folder's family; HubError when config or weights are missing or unsupported."""
    from flash_dllm.engine.weights import WeightsError, safetensor_files

    try:
        family = load_config(folder).family
        safetensor_files(folder)
    except (UnsupportedModelError, WeightsError) as err:
        raise HubError(f"{label}: {_one_line(err)}") from None
    return family


def _cached_snapshot(repo_id: str, env: HubEnv) -> Path | None:
    """The cached snapshot of `main` when it is complete, else None (no network)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        folder = snapshot_download(repo_id, revision=REVISION, allow_patterns=ALLOW_PATTERNS,
                                   cache_dir=env.cache_dir, local_files_only=True)
    except (LocalEntryNotFoundError, OSError, ValueError):  # IncompleteSnapshotError is a LocalEntryNotFoundError
        return None
    return Path(folder)


def _cached_or_raise(repo_id: str, env: HubEnv, reason: str) -> Path:
    """The usable cached copy, or a one-line error that names the reason the Hub was not asked."""
    folder = _cached_snapshot(repo_id, env)
    if folder is None:
        raise HubError(f"{reason}, and {repo_id} is not in the cache {env.cache_dir}; "
                       f"connect and run `flash-dllm-chat pull {repo_id}` once")
    try:
        _check_model_folder(folder, repo_id)
    except HubError as err:  # e.g. a pull that stopped before the weights were in
        raise HubError(f"{reason}, and the cached copy is incomplete ({err}); "
                       f"connect and run `flash-dllm-chat pull {repo_id}` to finish it") from None
    return folder


def _snapshot_of(storage: Path) -> Path | None:
    """The snapshot `refs/main` points to, else the newest one."""
    ref = storage / "refs" / REVISION
    if ref.is_file():
        folder = storage / "snapshots" / ref.read_text(errors="replace").strip()  # a damaged ref names nothing
        if folder.is_dir() and folder.parent == storage / "snapshots":
            return folder
    snapshots = [p for p in (storage / "snapshots").glob("*") if p.is_dir()]
    return max(snapshots, key=lambda p: p.stat().st_mtime) if snapshots else None


def _weights_size(folder: Path) -> int:
    from flash_dllm.engine.weights import safetensor_files

    return sum(path.stat().st_size for path in safetensor_files(folder))


def list_cached_models() -> list[CachedModel]:
    """Bundled models first, then every cached repo whose config is a supported family and whose weights are
    all there (a half-finished pull is not listed)."""
    models = []
    for folder in _bundled_folders():
        try:
            family = _check_model_folder(folder, folder.name)
            models.append(CachedModel(folder.name, folder, _weights_size(folder), family))
        except HubError:
            continue
    env = HubEnv.current()
    for storage in sorted(env.cache_dir.glob("models--*")):
        snapshot = _snapshot_of(storage)
        if snapshot is None:
            continue
        try:
            family = _check_model_folder(snapshot, storage.name)
        except HubError:
            continue
        name = storage.name[len("models--"):].replace("--", "/")
        models.append(CachedModel(name, snapshot, _weights_size(snapshot), family))
    return models


# ---- bundled models ------------------------------------------------------------------------------------------
def _bundled_folders() -> list[Path]:
    import flash_dllm.assets

    models = Path(flash_dllm.assets.__file__).parent / "models"
    found = []
    for name in ("tiny-chat", "tiny-cpu"):
        folder = models / name
        if (folder / "config.json").is_file() and any(folder.glob("*.safetensors")):
            found.append(folder)
    return found


def bundled_model_path() -> Path | None:
    folders = _bundled_folders()
    return folders[0] if folders else None


def is_bundled_name(text: str) -> bool:
    """`bundled` or a bundled model's folder name, while that model is here (resolve_model takes these)."""
    folders = _bundled_folders()
    return bool(folders) and (text == "bundled" or any(text == f.name for f in folders))


# ---- resolving and pulling -----------------------------------------------------------------------------------
def resolve_model(name_or_path: str, progress: Progress | None = None) -> Path:
    """A local folder as is; a bundled model's name; else a repo id -> its cached snapshot (pulled if needed)."""
    text = str(name_or_path).strip()
    if not text:
        raise HubError("no model given: pass a model folder or a Hugging Face repo id "
                       "such as GSAI-ML/LLaDA-8B-Instruct")
    path = Path(text).expanduser()
    if path.is_dir():
        return path.resolve()
    bundled = _bundled_folders()
    if text == "bundled" and bundled:  # the default bundled model, as bundled_model_path() names it
        return bundled[0]
    for folder in bundled:
        if text == folder.name:
            return folder
    if REPO_ID.match(text):
        return pull(text, progress)
    if path.exists():
        raise HubError(f"{text} is a file; give the model's folder (with config.json and *.safetensors)")
    names = ", ".join(["bundled", *(f.name for f in bundled)]) if bundled else ""
    raise HubError(f"{text}: no such folder, and not a Hugging Face repo id (org/name)"
                   + (f" or a bundled model ({names})" if names else ""))


def _sibling_sizes(info) -> dict[str, int]:
    sizes = {}
    for sibling in info.siblings or []:
        lfs = getattr(sibling, "lfs", None)
        size = getattr(sibling, "size", None) or (getattr(lfs, "size", None) if lfs is not None else None)
        sizes[sibling.rfilename] = int(size or 0)
    return sizes


class Unreachable(Exception):
    """The Hub did not answer (no connection, or no answer within the network timeout); says which."""


def _model_info(repo_id: str, env: HubEnv):
    """The repo's file list with sizes; Unreachable when the Hub cannot be reached or does not answer."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    try:
        return HfApi(endpoint=env.endpoint, token=env.token).model_info(
            repo_id, revision=REVISION, files_metadata=True, timeout=network_timeout_s())
    except network_errors() as err:
        stalled = "timeout" in type(err).__name__.lower() or "timed out" in str(err).lower()
        raise Unreachable(f"{env.endpoint} did not answer within {network_timeout_s():.0f} s" if stalled
                          else f"cannot reach {env.endpoint}") from None
    except HfHubHTTPError as err:
        raise _hub_error(repo_id, err, env) from None


def pull(repo_id: str, progress: Progress | None = None) -> Path:
    """Download (or complete) the repo's model files into the HF cache; return the snapshot folder."""
    from huggingface_hub import hf_hub_download, snapshot_download
    from huggingface_hub.errors import HfHubHTTPError

    if not REPO_ID.match(repo_id):
        raise HubError(f"{repo_id!r} is not a Hugging Face repo id (org/name)")
    env = HubEnv.current()
    env.activate()
    if env.offline:
        return _cached_or_raise(repo_id, env, "offline (HF_HUB_OFFLINE=1)")
    try:
        info = _model_info(repo_id, env)
    except Unreachable as why:
        return _cached_or_raise(repo_id, env, str(why))
    sizes = _sibling_sizes(info)
    ready = _complete_snapshot(repo_id, info.sha, sizes, env)
    if ready is not None:  # already pulled at the Hub's current commit: one request, no download
        _check_model_folder(ready, repo_id)
        return ready
    if "config.json" not in sizes:
        raise HubError(f"{repo_id} has no config.json, so it is no model this app runs; supported: {SUPPORTED}")
    weights = {name: size for name, size in sorted(sizes.items()) if name.endswith(".safetensors")}
    try:
        config = hf_hub_download(repo_id, "config.json", revision=info.sha, cache_dir=env.cache_dir,
                                 endpoint=env.endpoint, token=env.token)
        try:
            load_config(Path(config).parent)
        except UnsupportedModelError as err:  # refused before a single weight byte is fetched
            raise HubError(f"{repo_id}: {_one_line(err)}") from None
        if not weights:
            raise HubError(f"{repo_id} has no *.safetensors weights; "
                           "flash-dllm-chat never loads pickle (.bin/.pt) files")
        fetch_weights(repo_id, info.sha, weights, env.endpoint, env.cache_dir, env.token, progress)
        folder = Path(snapshot_download(repo_id, revision=REVISION, allow_patterns=ALLOW_PATTERNS,
                                        cache_dir=env.cache_dir, endpoint=env.endpoint, token=env.token,
                                        tqdm_class=silent_tqdm()))
    except DownloadError as err:
        raise HubError(str(err)) from None
    except network_errors() as err:
        raise HubError(f"download of {repo_id} interrupted ({_one_line(err)}); "
                       "run the same command again to resume") from None
    except HfHubHTTPError as err:
        raise _hub_error(repo_id, err, env) from None
    _check_model_folder(folder, repo_id)
    return folder


def _complete_snapshot(repo_id: str, sha: str, sizes: dict[str, int], env: HubEnv) -> Path | None:
    """The cached snapshot of `sha` when every wanted file is in it and `main` points there, else None."""
    from huggingface_hub.utils import filter_repo_objects

    storage = env.storage(repo_id)
    ref = storage / "refs" / REVISION
    folder = storage / "snapshots" / sha
    wanted = list(filter_repo_objects(sizes, allow_patterns=ALLOW_PATTERNS))
    if not wanted or not ref.is_file() or ref.read_text().strip() != sha:
        return None
    return folder if all((folder / name).is_file() for name in wanted) else None


def remote_weight_bytes(repo_id: str) -> int:
    """Bytes of the repo's safetensors (before downloading them); a local folder or a cached copy when offline."""
    path = Path(str(repo_id)).expanduser()
    if path.is_dir():
        return _weights_size(path)
    for folder in _bundled_folders():
        if repo_id == folder.name:
            return _weights_size(folder)
    if not REPO_ID.match(str(repo_id)):
        raise HubError(f"{repo_id}: no such folder, and not a Hugging Face repo id (org/name)")
    env = HubEnv.current()
    env.activate()
    if env.offline:
        return _weights_size(_cached_or_raise(repo_id, env, "offline (HF_HUB_OFFLINE=1)"))
    try:
        info = _model_info(repo_id, env)
    except Unreachable as why:
        return _weights_size(_cached_or_raise(repo_id, env, str(why)))
    return sum(size for name, size in _sibling_sizes(info).items() if name.endswith(".safetensors"))


# ---- memory fit ----------------------------------------------------------------------------------------------
NO_QUANTISED = "there is no quantised (8- or 4-bit) mode yet, so the weights load at 16 bits"


def needed_bytes(loaded_bytes: float) -> float:
    """Memory a model needs: its weights as loaded x 1.2 (activations, KV cache, workspaces) + 1 GiB margin."""
    return loaded_bytes * 1.2 + GIB


@dataclass(frozen=True)
class KnownFit:
    """A known checkpoint (engine/families.py KNOWN_MODELS) against a card of a given size, at bf16."""

    repo: str
    family: str
    weight_bytes: int
    need_bytes: float
    fits: bool


def known_model_fits(card_gib: float = 24.0) -> list[KnownFit]:
    """Whether each known model's bf16 weights fit a card of ``card_gib`` GiB by the rule of `fit_check`.
    There is no quantised mode yet, so a model that does not fit cannot run on such a card."""
    from flash_dllm.engine.families import KNOWN_MODELS

    return [KnownFit(m.repo, m.family, m.bf16_bytes, needed_bytes(m.bf16_bytes),
                     needed_bytes(m.bf16_bytes) <= card_gib * GIB) for m in KNOWN_MODELS.values()]


def fit_check(weight_bytes: int, device, dtype: str | None = None) -> tuple[bool, str]:
    """Whether weights of this size fit: free GPU memory (or available RAM) vs weights x 1.2 + 1 GiB.

    ``weight_bytes`` is the checkpoint's size on disk (16-bit for every supported model). On the CPU the
    engine loads weights as fp32 unless told otherwise (``dtype``), which doubles them in memory.
    """
    import torch

    if device in (None, "", "auto"):
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    upcast = dev.type != "cuda" and dtype in (None, "", "auto", "fp32", "float32")
    loaded = weight_bytes * (2 if upcast else 1)
    need = needed_bytes(loaded)
    as_loaded = f"{loaded / GIB:.1f} GiB weights" + (" as fp32" if upcast else "")
    wanted = f"needs about {need / GIB:.1f} GiB ({as_loaded} x 1.2 + 1 GiB working margin)"
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            return False, f"no CUDA GPU is available; the model {wanted}"
        free, total = torch.cuda.mem_get_info(dev)
        where = f"{dev} has {free / GIB:.1f} GiB free of {total / GIB:.1f} GiB"
    else:
        import psutil

        memory = psutil.virtual_memory()
        free = memory.available
        where = f"RAM has {free / GIB:.1f} GiB available of {memory.total / GIB:.1f} GiB"
    ok = need <= free
    return ok, f"{'fits' if ok else 'does not fit'}: {wanted}; {where}" + ("" if ok else f"; {NO_QUANTISED}")
