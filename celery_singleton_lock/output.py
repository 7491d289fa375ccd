"""Old path of :mod:`celery_singleton_lock.cli.output`, kept for one release."""

from .cli.output import *  # noqa: F403
from .cli.output import _row as _row
