"""The command line: ``celery -A proj locks ...`` and ``python -m celery_singleton_lock ...``
(commands.py), and how their results are shown (output.py).

Celery imports every plugin's CLI module at start, so nothing of the lock core is imported
here; what ``celery_singleton_lock.cli`` offered before it became a package is re-exported.
"""

from .commands import *  # noqa: F403
