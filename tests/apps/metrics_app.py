"""``worker_app`` with the Prometheus recipe of docs/monitoring.md, for
``tests/tasks/test_prometheus.py``'s prefork worker: the metrics are registered where the worker
imports its app, before the pool forks, and prometheus_client runs in multiprocess mode
(``PROMETHEUS_MULTIPROC_DIR`` set by the test)."""

from __future__ import annotations

from apps.worker_app import app
from celery_singleton_lock.celery.prometheus import register_metrics

register_metrics()

__all__ = ["app"]
