"""The Ringside Django project: settings, URLs, the ASGI app and the Celery app."""

from ringside.celery import app as celery_app

__all__ = ["celery_app"]
