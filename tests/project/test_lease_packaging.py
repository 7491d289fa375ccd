"""The Lua scripts ship in the wheel and load from the installed package."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import celery_singleton_lock
from celery_singleton_lock.core.scripts import SCRIPT_NAMES

ROOT = Path(__file__).resolve().parent.parent.parent
LUA_DIR = ROOT / "celery_singleton_lock" / "lua"


@pytest.mark.timeout(120)
def test_every_lua_script_is_in_the_wheel_and_loads_from_the_installed_package(
    tmp_path: Path,
) -> None:
    assert Path(celery_singleton_lock.__file__).resolve().parent == LUA_DIR.parent
    lua_files = sorted(path.name for path in LUA_DIR.glob("*.lua"))
    assert {f"{name}.lua" for name in SCRIPT_NAMES} <= set(lua_files)

    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(ROOT)],
        check=True,
        timeout=110,
    )
    (wheel,) = wheels.glob("celery_singleton_lock-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        shipped = set(archive.namelist())
        archive.extractall(tmp_path / "site")
    missing = [name for name in lua_files if f"celery_singleton_lock/lua/{name}" not in shipped]
    assert not missing, f"not in the wheel: {missing}"

    # Import from the unpacked wheel, not the checkout: the script names every file.
    site = tmp_path / "site"
    names = sorted({*SCRIPT_NAMES, *(name.removesuffix(".lua") for name in lua_files)})
    check = (
        "import json, celery_singleton_lock.core.scripts as s\n"
        f"assert s.__file__.startswith({str(site)!r}), s.__file__\n"
        f"print(json.dumps({{name: s.source(name) for name in {names!r}}}))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    result = subprocess.run(
        [sys.executable, "-c", check],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    sources = json.loads(result.stdout)
    for name in names:
        assert sources[name] == (LUA_DIR / f"{name}.lua").read_text("utf-8"), name
