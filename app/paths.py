"""Where the app keeps its own settings and data (chats): platformdirs' per-user folders.

``FLASH_DLLM_HOME`` overrides both (tests, portable installs): settings go to ``$FLASH_DLLM_HOME/config`` and
data to ``$FLASH_DLLM_HOME/data``. Model weights are not kept here: they live in the Hugging Face cache.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

APP_NAME = "flash-dllm-chat"
HOME_ENV = "FLASH_DLLM_HOME"
SETTINGS_FILE = "settings.json"
LAST_MODEL_KEY = "last_model"


def _home_override() -> Path | None:
    value = os.environ.get(HOME_ENV, "").strip()
    return Path(value).expanduser() if value else None


def config_dir(create: bool = True) -> Path:
    """Folder of settings.json (created on first use; ``create=False`` for a read, which must work in a
    read-only home where nothing will be written)."""
    return _folder("config", "user_config_dir", create)


def data_dir(create: bool = True) -> Path:
    """Folder for saved chats and other user data (created on first use)."""
    return _folder("data", "user_data_dir", create)


def _folder(override_name: str, platform_dir: str, create: bool) -> Path:
    import platformdirs

    home = _home_override()
    folder = home / override_name if home else Path(getattr(platformdirs, platform_dir)(APP_NAME, appauthor=False))
    if create:
        folder.mkdir(parents=True, exist_ok=True)
    return folder


def settings_path(create: bool = True) -> Path:
    """settings.json (readers pass ``create=False``: reading must not need a writable home)."""
    return config_dir(create) / SETTINGS_FILE


def check_writable(folder: Path) -> None:
    """Create ``folder`` and prove a file can be written there; OSError (with the folder named) otherwise.
    The app checks its chats folder at start, so a read-only data folder is reported once, in one line,
    instead of failing every turn later."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=folder, prefix=".write-test-", delete=True)
        probe.close()
    except OSError as err:
        raise OSError(f"cannot write in {folder} ({err.strerror or err}); make it writable or set "
                      f"{HOME_ENV} to another folder") from None


def load_app_settings() -> dict:
    """The saved settings, or {} when there are none yet or the file is unreadable (a settings file must
    never keep the app from starting; the next save replaces a corrupt one)."""
    path = settings_path(create=False)
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def save_app_settings(settings: dict) -> None:
    """Write settings.json atomically: a temp file in the same folder, fsync, then rename over the old one,
    so a crash or a second process never leaves a half-written file behind."""
    path = settings_path()
    text = json.dumps(settings, indent=2, sort_keys=True, ensure_ascii=False)
    handle, tmp_name = tempfile.mkstemp(prefix=".settings-", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as tmp:
            tmp.write(text)
            tmp.flush()
            os.fsync(tmp.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def update_app_settings(**changes) -> dict:
    """Load, merge `changes` and save; returns the merged settings."""
    settings = load_app_settings()
    settings.update(changes)
    save_app_settings(settings)
    return settings


def last_model() -> str | None:
    value = load_app_settings().get(LAST_MODEL_KEY)
    return value if isinstance(value, str) and value.strip() else None


def remember_model(name: str) -> None:
    update_app_settings(**{LAST_MODEL_KEY: name})
