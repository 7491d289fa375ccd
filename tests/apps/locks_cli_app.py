"""A tiny Celery app for the ``celery -A locks_cli_app locks ...`` tests: its lock URL and prefix
come from the environment the test sets. It declares a preload option, which crashes plugin
commands that do not handle preload options."""

import os

from celery import Celery
from click import Option

app = Celery("locks_cli_app", set_as_current=False)
app.conf.update(
    broker_url=os.environ.get("CSL_TEST_BROKER_URL", "memory://"),
    singleton_lock_url=os.environ.get("CSL_TEST_LOCK_URL"),
    singleton_lock_prefix=os.environ.get("CSL_TEST_LOCK_PREFIX", "csl:"),
)
app.user_options["preload"].add(
    Option(["--csl-test-flag"], is_flag=True, default=False, help="A preload option.")
)
