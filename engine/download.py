"""Resumable download of a repo's weight files into the Hugging Face cache layout.

huggingface_hub >= 1 downloads into a per-process temp file and deletes it when the download dies, so an 8B
model interrupted at 90% of a 5 GB shard would start that shard over. Here the partial bytes stay in
`blobs/<etag>.incomplete` (the name older huggingface_hub versions resumed from; content-addressed by the
etag, so a resume never mixes two versions of a file) and the next attempt or run asks for the rest with a
Range request. The finished file lands at `blobs/<etag>`, exactly where huggingface_hub looks for it, so its
snapshot_download afterwards only links it into the snapshot folder.
"""
from __future__ import annotations

import importlib
import math
import os
import sys
import threading
import time
from pathlib import Path
from typing import Callable

REPORT_EVERY = 1024 * 1024  # bytes between two progress callbacks (one network read is ~64 KiB)
MAX_STALLS = 3  # failed attempts in a row without a single new byte before a download gives up
TIMEOUT_ENV = "HF_HUB_DOWNLOAD_TIMEOUT"  # huggingface_hub's own variable, read at call time here
DEFAULT_TIMEOUT_S = 20.0  # seconds without a connection or a byte before a Hub call counts as stalled
_timeouts_lock = threading.Lock()
_timeouts_installed = False

Progress = Callable[[int, int], None]


class DownloadError(RuntimeError):
    """A download that stopped; the message says how far it got and that running again resumes it."""


def network_errors() -> tuple[type[BaseException], ...]:
    """Connection-level failures (as opposed to answers from the Hub) of whichever HTTP stack is installed."""
    from huggingface_hub.errors import OfflineModeIsEnabled

    found: list[type[BaseException]] = [OfflineModeIsEnabled, ConnectionError, TimeoutError]
    for module, names in (("httpx2", ("TransportError",)), ("httpx", ("TransportError",)),
                          ("requests", ("ConnectionError", "Timeout"))):
        try:
            mod = importlib.import_module(module)
        except ImportError:
            continue
        found += [getattr(mod, name) for name in names if hasattr(mod, name)]
    return tuple(found)


def network_timeout_s() -> float:
    """How long one network step (connect, or the next bytes) may take before it fails."""
    try:
        value = float(os.environ.get(TIMEOUT_ENV, ""))
    except ValueError:
        return DEFAULT_TIMEOUT_S
    return value if math.isfinite(value) and value > 0 else DEFAULT_TIMEOUT_S


def install_timeouts() -> None:
    """Give every request huggingface_hub makes a timeout. Its shared client has none, and several of its
    calls pass ``timeout=None`` explicitly (model_info, the repo_info inside snapshot_download), which
    disables a client-wide default; so the timeout is added below the client, in its transport, to each
    request that has none. A Hub that accepts connections and never answers then fails the call within
    `network_timeout_s` instead of hanging it (and the app's model switch, and a pull) forever."""
    global _timeouts_installed
    from huggingface_hub import set_client_factory
    from huggingface_hub.utils import get_session

    with _timeouts_lock:
        if _timeouts_installed:
            return
        template = get_session()  # built by the current factory: keep its class and event hooks
        client_class, hooks = type(template), template.event_hooks
        http = importlib.import_module(client_class.__module__.split(".")[0])  # httpx or httpx2

        class TimeoutTransport(http.BaseTransport):
            def __init__(self):
                self.inner = http.HTTPTransport()

            def handle_request(self, request):
                limit = network_timeout_s()
                given = request.extensions.get("timeout") or {}
                request.extensions["timeout"] = {key: given.get(key) or limit
                                                 for key in ("connect", "read", "write", "pool")}
                return self.inner.handle_request(request)

            def close(self) -> None:
                self.inner.close()

        set_client_factory(lambda: client_class(event_hooks=hooks, follow_redirects=True,
                                                transport=TimeoutTransport()))
        _timeouts_installed = True


def human_size(n: int) -> str:
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


def repo_storage(cache_dir: Path, repo_id: str) -> Path:
    """huggingface_hub's folder of a model repo inside the cache."""
    return Path(cache_dir) / ("models--" + repo_id.replace("/", "--"))


def silent_tqdm():
    """A tqdm class that draws nothing: snapshot_download's own bars would repeat ours (after the weights it
    only moves small files)."""
    from tqdm.auto import tqdm

    class Silent(tqdm):
        def __init__(self, *args, **kwargs):
            kwargs.pop("name", None)
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)

    return Silent


class Reporter:
    """One terminal bar (tqdm, drawn only on a TTY) plus the caller's progress(done, total) callback."""

    def __init__(self, repo_id: str, total: int, progress: Progress | None):
        from huggingface_hub.utils import are_progress_bars_disabled
        from tqdm.auto import tqdm

        self.done, self.total, self.progress, self.reported = 0, total, progress, 0
        self.bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=f"Downloading {repo_id}",
                        disable=True if are_progress_bars_disabled() else None, file=sys.stderr)

    def add(self, n: int) -> None:
        if not n:
            return
        self.done += n
        self.bar.update(n)
        if self.progress is not None and (abs(self.done - self.reported) >= REPORT_EVERY or self.done >= self.total):
            self.reported = self.done
            self.progress(self.done, self.total)

    def close(self) -> None:
        self.bar.close()


def fetch_weights(repo_id: str, sha: str, weights: dict[str, int], endpoint: str, cache_dir: Path,
                  token: str | None, progress: Progress | None) -> None:
    """Download every file of `weights` (name -> expected bytes) at commit `sha` into the cache's blobs."""
    reporter = Reporter(repo_id, sum(weights.values()), progress)
    try:
        if progress is not None:
            progress(0, reporter.total)
        for name, size in weights.items():
            fetch_blob(repo_id, sha, name, size, endpoint, cache_dir, token, reporter)
    finally:
        reporter.close()


def fetch_blob(repo_id: str, sha: str, name: str, size: int, endpoint: str, cache_dir: Path, token: str | None,
               reporter: Reporter) -> None:
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.utils import WeakFileLock, build_hf_headers

    url = hf_hub_url(repo_id, name, revision=sha, endpoint=endpoint)
    meta = get_hf_file_metadata(url, token=token)  # etag (sha256 for LFS files), size, CDN location
    etag, size = meta.etag, meta.size if meta.size is not None else size
    if not etag:
        raise DownloadError(f"{endpoint} sent no ETag for {repo_id}/{name}; is HF_ENDPOINT a Hugging Face Hub?")
    storage = repo_storage(cache_dir, repo_id)
    blob = storage / "blobs" / etag
    if blob.exists():
        reporter.add(size)
        return
    blob.parent.mkdir(parents=True, exist_ok=True)
    lock = Path(cache_dir) / ".locks" / storage.name / f"{etag}.lock"  # the lock huggingface_hub itself takes
    lock.parent.mkdir(parents=True, exist_ok=True)
    headers = build_hf_headers(token=token)
    location = meta.location or url
    if location.split("/")[2] != url.split("/")[2]:
        headers.pop("authorization", None)  # a signed CDN url: the token stays with the Hub
    with WeakFileLock(str(lock)):
        if blob.exists():  # another process finished it while we waited
            reporter.add(size)
            return
        partial = blob.with_name(f"{etag}.incomplete")
        download_resumable(location, partial, size, headers, reporter, f"{repo_id}/{name}")
        os.replace(partial, blob)


def download_resumable(url: str, partial: Path, size: int, headers: dict, reporter: Reporter, label: str) -> None:
    """Append the missing bytes of `url` to `partial` until it holds `size` bytes. A dropped connection is
    retried from where it stopped while bytes keep arriving; anything else raises DownloadError, keeping
    `partial` for the next run."""
    from huggingface_hub.errors import HfHubHTTPError
    from huggingface_hub.utils import get_session, hf_raise_for_status

    counted, stalls = 0, 0  # bytes of this file already reported; attempts in a row without progress
    while True:
        have = partial.stat().st_size if partial.exists() else 0
        if have > size:  # longer than the file: not a prefix of it, start over
            partial.unlink()
            have = 0
        reporter.add(have - counted)
        counted = have
        if have == size:
            return
        stopped = f"download of {label} stopped at {human_size(have)} of {human_size(size)}"
        request_headers = dict(headers, **({"Range": f"bytes={have}-"} if have else {}))
        got = 0
        try:
            with get_session().stream("GET", url, headers=request_headers, follow_redirects=True,
                                      timeout=network_timeout_s()) as response:
                hf_raise_for_status(response)
                if have and response.status_code != 206:  # the server ignored the Range: take the whole file
                    reporter.add(-counted)
                    counted = have = 0
                with partial.open("ab" if have else "wb") as out:
                    for chunk in response.iter_bytes():  # as they arrive: a drop loses nothing received
                        out.write(chunk)
                        got += len(chunk)
                        counted += len(chunk)
                        reporter.add(len(chunk))
        except HfHubHTTPError as err:
            status = getattr(err.response, "status_code", 0)
            if status < 500 and status != 429:  # a refusal (gone, forbidden): the caller words it
                raise
            raise DownloadError(f"{stopped} (the Hub answered {status}); "
                                "run the same command again to resume") from None
        except network_errors() as err:
            stalls = 0 if got else stalls + 1
            if stalls >= MAX_STALLS:
                reason = " ".join(str(err).split())[:160] or type(err).__name__
                raise DownloadError(f"{stopped} ({reason}); run the same command again to resume") from None
            time.sleep(0.5 * stalls)
            continue
        if got and partial.stat().st_size < size:  # the body ended early without an error: ask for the rest
            continue
        if partial.stat().st_size != size:
            raise DownloadError(f"{stopped}: the Hub sent {got} bytes and then nothing; run the same command again")
        return
