"""A small Celery project that shows celery_singleton_lock at work: run it with
``python -m example_project``."""
