"""monapp -- the Celery app the `celery -A monapp ...` CLI tests load.

The broker and backend come from the environment, so every test points the
real Python CLI at its own vhost and Redis database."""
import os

from celery import Celery

app = Celery("monapp",
             broker=os.environ.get("CELERIAC_TEST_BROKER", "amqp://guest:guest@localhost//"),
             backend=os.environ.get("CELERIAC_TEST_BACKEND"))
app.conf.update(result_expires=3600)
