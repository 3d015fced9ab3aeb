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


def config_dir() -> Path:
    """Folder of settings.json (created on first use)."""
    import platformdirs

    home = _home_override()
    folder = home / "config" if home else Path(platformdirs.user_config_dir(APP_NAME, appauthor=False))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def data_dir() -> Path:
    """Folder for saved chats and other user data (created on first use)."""
    import platformdirs

    home = _home_override()
    folder = home / "data" if home else Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def settings_path() -> Path:
    return config_dir() / SETTINGS_FILE


def load_app_settings() -> dict:
    """The saved settings, or {} when there are none yet or the file is unreadable (a settings file must
    never keep the app from starting; the next save replaces a corrupt one)."""
    path = settings_path()
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
