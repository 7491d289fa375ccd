"""Generative history check across the feature matrix, on demand (support/scenarios.py says
what a scenario is and what the check fails; tests/tasks/test_scenarios.py is the suite's
short run).

    .venv/bin/python tests/scenarios.py --seed 7                 # every scenario of seed 7
    .venv/bin/python tests/scenarios.py --seed 7 --only 12       # replay scenario #12
    .venv/bin/python tests/scenarios.py --seed 7 --minutes 20    # a soak with a time budget
    .venv/bin/python tests/scenarios.py --scenario read/replace/pause/redis
"""

from __future__ import annotations

import argparse
import random
import signal
import sys

from support.scenarios import Scenario, pairwise, run_scenarios, uncovered_pairs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Generative scenario history check.")
    parser.add_argument("--seed", type=int, default=None, help="draws the pairwise set")
    parser.add_argument("--only", type=int, action="append", help="a scenario index (repeat)")
    parser.add_argument("--scenario", action="append", help="kind/feature/fault/transport")
    parser.add_argument("--minutes", type=float, default=None, help="stop starting after")
    parser.add_argument("--list", action="store_true", help="print the scenarios and exit")
    args = parser.parse_args(argv)
    seed = random.randrange(1_000_000) if args.seed is None else args.seed
    scenarios = list(enumerate(pairwise(seed)))
    if args.only:
        scenarios = [scenarios[i] for i in args.only]
    if args.scenario:
        scenarios = [(-1, Scenario.parse(label)) for label in args.scenario]
    print(f"seed {seed}: {len(scenarios)} scenarios", flush=True)
    if args.list:
        for index, scenario in scenarios:
            print(f"#{index} {scenario.label()}")
        missing = uncovered_pairs([s for _, s in scenarios])
        print(f"pairs not covered: {len(missing)}")
        return 0
    # A SIGTERM unwinds as an exit does, so the workers and servers are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    budget = None if args.minutes is None else args.minutes * 60
    outcomes = run_scenarios(
        seed, scenarios, budget=budget, out=lambda line: print(line, flush=True)
    )
    failed = [o for o in outcomes if o.violations]
    print(f"seed {seed}: {len(outcomes)} run, {len(failed)} failed")
    for outcome in failed:
        print(f"  FAILED #{outcome.index} {outcome.scenario.label()}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
