"""The Celery layer: SingletonTask and what a worker needs around it."""
