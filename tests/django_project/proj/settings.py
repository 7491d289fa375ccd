"""Settings of the test Django project. The test sets the Redis, the key prefix (also the
queue's name) and the database file in the environment."""

import os

SECRET_KEY = "test-only"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django_celery_beat",
    "reports",
]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("CSL_DJANGO_DB", "db.sqlite3"),
        # The worker, beat and the test read and write the file at once.
        "OPTIONS": {"timeout": 30},
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = os.environ.get("CSL_DJANGO_REDIS_URL", "redis://127.0.0.1:1/0")
PREFIX = os.environ.get("CSL_DJANGO_PREFIX", "csltest:django:")

CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = REDIS_URL
CELERY_RESULT_EXPIRES = 600
CELERY_TASK_DEFAULT_QUEUE = f"{PREFIX}queue"
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
# This package's settings, in the same namespace.
CELERY_SINGLETON_LOCK_PREFIX = PREFIX
CELERY_SINGLETON_LOCK_LEASE = 6
CELERY_SINGLETON_LOCK_TTL = 60
