"""Benchmarks of celery_singleton_lock against the Redis locks people already use.

Run everything: ``python -m benchmarks``; one section: ``python -m benchmarks lease``;
a short run: ``--quick``. See ``python -m benchmarks --help``.

Adding a section: put a module in this package that defines ``run(ctx) -> list[Table]`` and
registers it with :func:`benchmarks.registry.section`; ``__main__`` imports every module of the
package, so nothing else needs editing.
"""
