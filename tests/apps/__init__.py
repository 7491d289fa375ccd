"""Celery apps the tests start real workers of (``celery -A apps.<module> worker``, run
from the tests folder)."""
