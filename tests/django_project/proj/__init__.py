"""A small Django project, as Celery's Django guide lays one out: the Celery app is loaded
with Django so that ``shared_task`` binds to it."""

from .celery import app as celery_app

__all__ = ("celery_app",)
