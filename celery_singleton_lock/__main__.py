"""``python -m celery_singleton_lock --url redis://... list|show|clear``: the ``celery locks``
commands without a Celery app (see docs/admin.md)."""

from .cli.commands import main

if __name__ == "__main__":
    main(prog_name="python -m celery_singleton_lock")
