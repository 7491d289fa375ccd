"""The command line: ``celery -A proj locks ...`` and ``python -m celery_singleton_lock ...``
(commands.py), and how their results are shown (output.py). Celery imports the commands
module in every ``celery`` program (the package's entry point), so nothing of the lock core is
imported at module level there."""
