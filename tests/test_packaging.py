"""The wheel installs everything under the `flash_dllm` namespace: every module and every asset file."""
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"app": "flash_dllm/app", "engine": "flash_dllm/engine", "kernels": "flash_dllm/kernels",
            "assets": "flash_dllm/assets"}


def source_files(folder: str, suffixes: tuple[str, ...] | None) -> set[str]:
    """Files a user needs: modules (or, for assets, every file), without caches."""
    found = set()
    for path in (ROOT / folder).rglob("*"):
        if not path.is_file() or "__pycache__" in path.parts or path.suffix == ".pyc":
            continue
        if suffixes is None or path.suffix in suffixes:
            found.add(f"{PACKAGES[folder]}/{path.relative_to(ROOT / folder).as_posix()}")
    return found


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    """Build from a copy of the tree, so the build's own folders never land in the working tree."""
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, source / name)
    for folder in PACKAGES:
        shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation",
                           "--no-index", "-q", "-w", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (built,) = out.glob("flash_dllm_chat-*.whl")
    return zipfile.ZipFile(built)


def test_wheel_holds_every_module(wheel):
    names = set(wheel.namelist())
    for folder in ("app", "engine", "kernels"):
        missing = source_files(folder, (".py",)) - names
        assert not missing, f"modules missing from the wheel: {sorted(missing)}"


def test_wheel_holds_every_asset_file(wheel):
    missing = source_files("assets", None) - set(wheel.namelist())
    assert not missing, f"asset files missing from the wheel (package-data patterns?): {sorted(missing)}"


def test_no_top_level_source_folders_in_the_wheel(wheel):
    tops = {name.split("/")[0] for name in wheel.namelist()}
    assert not tops & {"app", "engine", "kernels", "assets", "tests"}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"flash_dllm"}


def test_console_script_entry_point(wheel):
    (entry_points,) = [n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")]
    text = wheel.read(entry_points).decode()
    assert "flash-dllm-chat = flash_dllm.app.cli:main" in text
