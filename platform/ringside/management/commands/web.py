"""`manage.py web`: only the web server, as `serve` runs it (the Docker image's command)."""

import os

from django.conf import settings
from django.core.management.base import BaseCommand

from common.services import (
    add_web_address_arguments,
    child_env,
    web_processes,
    web_server_command,
)


class Command(BaseCommand):
    help = "Run the ASGI server (uvicorn, WEB_PROCESSES worker processes) in this process."

    def add_arguments(self, parser):
        add_web_address_arguments(parser)

    def handle(self, *args, host: str, port: int, **options) -> None:
        argv = web_server_command(host, port, web_processes(), settings.TRUSTED_PROXIES)
        os.execve(argv[0], argv, child_env())
