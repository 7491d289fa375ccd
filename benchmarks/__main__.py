"""``python -m benchmarks [SECTION ...] [--quick] [--markdown]``: run and print the tables."""

from __future__ import annotations

import argparse
import sys
import time

from .context import open_context
from .registry import Section, discover
from .report import render_markdown, render_text


def parse(sections: list[Section], argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Benchmarks of celery_singleton_lock. Uses a throwaway redis-server, or "
        "$REDIS_URL when set (under a unique key prefix; nothing is flushed).",
    )
    parser.add_argument(
        "sections",
        nargs="*",
        metavar="SECTION",
        help="sections to run (default: all): " + ", ".join(s.name for s in sections),
    )
    parser.add_argument("--quick", action="store_true", help="a short run (fewer iterations)")
    parser.add_argument("--markdown", action="store_true", help="print Markdown tables")
    for sec in sections:
        if sec.add_arguments is not None:
            sec.add_arguments(parser.add_argument_group(f"section {sec.name!r}"))
    options = parser.parse_args(argv)
    unknown = set(options.sections) - {s.name for s in sections}
    if unknown:
        parser.error(f"unknown section(s): {', '.join(sorted(unknown))}")
    return options


def main(argv: list[str] | None = None) -> int:
    sections = discover()
    options = parse(sections, argv)
    chosen = [s for s in sections if not options.sections or s.name in options.sections]
    render = render_markdown if options.markdown else render_text
    with open_context(options) as ctx:
        print(f"# {ctx.describe()}{' - quick run' if ctx.quick else ''}", flush=True)
        for sec in chosen:
            started = time.monotonic()
            print(f"\n## {sec.name}: {sec.title}", flush=True)
            for table in sec.run(ctx):
                print("\n" + render(table), flush=True)
            print(f"\n({sec.name}: {time.monotonic() - started:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
