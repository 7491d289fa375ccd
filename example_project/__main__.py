"""Run the example: ``python -m example_project [--seconds N]``.

Starts a throwaway Redis when ``REDIS_URL`` is unset, a worker with beat embedded (prefork,
6 processes), sends some per-customer and import jobs with duplicates, then prints what ran
and what was skipped, and stops everything.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from typing import Any


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m example_project")
    parser.add_argument("--seconds", type=float, default=30.0, help="how long to run (30)")
    options = parser.parse_args()
    with ExitStack() as stack:
        if not os.environ.get("REDIS_URL"):
            from celery_singleton_lock.embedded import RedisServer

            server = stack.enter_context(RedisServer())
            os.environ["REDIS_URL"] = server.url
            print(f"started a throwaway redis-server at {server.url}")
        else:
            print(f"using REDIS_URL={os.environ['REDIS_URL']}")
        return run(options.seconds, stack)


def run(seconds: float, stack: ExitStack) -> int:
    from celery_singleton_lock import is_skipped
    from example_project.tasks import import_feed, sync_customer

    beat_schedule = os.path.join(tempfile.gettempdir(), "csl-example-beat")
    command = [sys.executable, "-m", "celery", "-A", "example_project.celery_app", "worker"]
    command += ["--beat", "--schedule", beat_schedule, "-P", "prefork", "-c", "6"]
    command += ["-l", "INFO", "--without-gossip", "--without-mingle"]
    worker = subprocess.Popen(command, env=os.environ.copy())
    stack.callback(_stop, worker)
    results: list[tuple[str, Any]] = []
    started = time.monotonic()
    time.sleep(3)  # let the worker come up before the first batch (demo pacing)
    for customer in (1, 2, 1, 3, 1):  # customer 1 three times: two are duplicates
        results.append((f"sync_customer({customer})", sync_customer.delay(customer)))
    results.append(("import_feed('prices')", import_feed.delay("prices")))
    time.sleep(3)  # the first import has ended; the next one falls in its release delay
    results.append(("import_feed('prices') again", import_feed.delay("prices")))
    time.sleep(max(0.0, seconds - (time.monotonic() - started)))

    print("\n=== what happened ===")
    for label, result in results:
        value = result.get(timeout=30)
        outcome = f"SKIPPED ({value['reason']})" if is_skipped(value) else value
        print(f"{label:32} {outcome}")
    print(
        "sales_report (beat, every 4 s, runs 9 s): see 'report run started' and"
        " 'skipped: lock' lines above"
    )
    return 0


def _stop(worker: subprocess.Popen[bytes]) -> None:
    if worker.poll() is None:
        worker.send_signal(signal.SIGTERM)  # warm shutdown: running jobs finish and release
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()


if __name__ == "__main__":
    raise SystemExit(main())
