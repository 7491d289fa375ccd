"""Chaos soak driver: real prefork workers killed, paused, cut off from a restarted lock Redis
and answered late by it for as long as asked, then the history of every call checked
(support/chaos.py and support/history.py say how).

    .venv/bin/python tests/chaos.py --seconds 300   # a soak; tests/tasks/test_chaos.py: ~60 s
"""

from __future__ import annotations

import argparse
import sys

from support.chaos import run_chaos


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Chaos history check.")
    parser.add_argument("--seconds", type=float, default=300.0, help="chaos duration")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--keys", type=int, default=3)
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args(argv)
    report = run_chaos(args.seconds, workers=args.workers, keys=args.keys, seed=args.seed)
    return 1 if report.violations else 0


if __name__ == "__main__":
    sys.exit(main())
