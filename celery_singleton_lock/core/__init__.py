"""The lock core's bottom floor: Redis keys, argument validation, Redis URLs -> clients, the
release notifier and the Lua scripts. It imports nothing of Celery, the admin view or the
CLI (tests/project/test_layers.py checks)."""
