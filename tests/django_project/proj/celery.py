"""The project's Celery app: every setting from Django's settings, in the ``CELERY_``
namespace (``CELERY_SINGLETON_LOCK_TTL`` is ``singleton_lock_ttl``)."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "proj.settings")

app = Celery("proj")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
