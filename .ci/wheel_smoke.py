"""Smoke test of an installed wheel, run by .ci/wheel_smoke from a virtualenv that has the
wheel and nothing of the source tree (run it from a directory outside the checkout, so the
package is imported from site-packages).

Checks that the wheel ships the Lua scripts and py.typed, that ``celery locks --help`` works
(the command comes from the ``celery.commands`` entry point) as does ``python -m
celery_singleton_lock --help``, and makes a lease round trip against a throwaway
redis-server on a free port (``celery_singleton_lock.embedded``), stopped at the end.
"""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata, resources
from pathlib import Path


def check(condition: bool, message: str) -> None:
    if not condition:
        sys.exit(f"wheel smoke test failed: {message}")
    print(f"ok: {message}")


def main() -> None:
    import celery_singleton_lock
    from celery_singleton_lock import LockClient
    from celery_singleton_lock.embedded import RedisServer

    installed = Path(celery_singleton_lock.__file__).resolve().parent
    check("site-packages" in installed.parts, f"imported from the installed wheel ({installed})")
    version = metadata.version("celery-singleton-lock")
    check(
        version == celery_singleton_lock.__version__,
        f"distribution version {version} is the package's __version__",
    )

    package = resources.files("celery_singleton_lock")
    scripts = sorted(entry.name for entry in package.joinpath("lua").iterdir())
    check(
        "acquire.lua" in scripts and "release.lua" in scripts and "renew.lua" in scripts,
        f"{len(scripts)} Lua scripts in the wheel",
    )
    check(package.joinpath("py.typed").is_file(), "py.typed in the wheel")

    commands = {ep.name: ep.value for ep in metadata.entry_points(group="celery.commands")}
    check(
        commands.get("locks") == "celery_singleton_lock.cli.commands:locks",
        "entry point celery.commands: locks",
    )
    celery = str(Path(sys.executable).with_name("celery"))
    for command in (
        [celery, "locks", "--help"],
        [sys.executable, "-m", "celery_singleton_lock", "--help"],
    ):
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
        shown = " ".join([Path(command[0]).name, *command[1:]])
        check(
            done.returncode == 0 and "doctor" in done.stdout and "clear" in done.stdout,
            f"{shown} lists the commands",
        )

    with RedisServer() as server:
        client = LockClient.from_url(server.url)
        try:
            lease = client.lease("wheel-smoke", ttl=5)
            check(lease.acquire(), f"lease acquired on {server.url}")
            rival = client.lease("wheel-smoke", ttl=5)
            check(not rival.acquire(), "a second lease of the same name is refused")
            check(lease.token is not None and lease.held, f"held with fencing token {lease.token}")
            check([info.name for info in client.locks()] == ["wheel-smoke"], "listed by locks()")
            listed = subprocess.run(
                [sys.executable, "-m", "celery_singleton_lock", "--url", server.url, "list"],
                capture_output=True,
                text=True,
                timeout=60,
            )
            check(
                listed.returncode == 0 and "wheel-smoke" in listed.stdout,
                "python -m celery_singleton_lock list shows it",
            )
            lease.release()
            check(not lease.held, "released")
            check(rival.acquire(), "the name is free again after the release")
            rival.release()
        finally:
            client.close()
    check(server.process is None, "redis-server stopped")


if __name__ == "__main__":
    main()
