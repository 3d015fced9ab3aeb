"""App settings and data folders: FLASH_DLLM_HOME override, atomic JSON settings."""
import json
import sys

import pytest

from flash_dllm.app import paths


def test_home_override_and_round_trip(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASH_DLLM_HOME", str(tmp_path / "home"))
    assert paths.config_dir() == tmp_path / "home" / "config" and paths.config_dir().is_dir()
    assert paths.data_dir() == tmp_path / "home" / "data" and paths.data_dir().is_dir()
    assert paths.load_app_settings() == {}
    paths.save_app_settings({"last_model": "org/name", "theme": "dark"})
    assert json.loads((tmp_path / "home" / "config" / "settings.json").read_text())["theme"] == "dark"
    paths.remember_model("GSAI-ML/LLaDA-8B-Instruct")
    assert paths.load_app_settings() == {"last_model": "GSAI-ML/LLaDA-8B-Instruct", "theme": "dark"}
    assert paths.last_model() == "GSAI-ML/LLaDA-8B-Instruct"
    assert [p.name for p in paths.config_dir().iterdir()] == ["settings.json"]  # no temp file left behind


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="XDG folders are platformdirs' Linux layout")
def test_default_folders_come_from_platformdirs(monkeypatch, tmp_path):
    monkeypatch.delenv("FLASH_DLLM_HOME", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg-config"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg-data"))
    assert paths.config_dir() == tmp_path / "xdg-config" / "flash-dllm-chat"
    assert paths.data_dir() == tmp_path / "xdg-data" / "flash-dllm-chat"


def test_corrupt_or_foreign_settings_do_not_break_startup(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASH_DLLM_HOME", str(tmp_path))
    paths.settings_path().write_text("{not json")
    assert paths.load_app_settings() == {}
    paths.settings_path().write_text("[1, 2]")
    assert paths.load_app_settings() == {} and paths.last_model() is None
    paths.update_app_settings(last_model="x/y")
    assert paths.load_app_settings() == {"last_model": "x/y"}
