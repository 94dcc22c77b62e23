"""The Celery app (`celery -A ringside worker`); its settings are the CELERY_* Django settings."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ringside.settings")

app = Celery("ringside")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
