"""`manage.py web`: only the web server, as `serve` runs it (the Docker image's command)."""

import os

from django.core.management.base import BaseCommand

from ringside.services import child_env, web_processes, web_server_command


class Command(BaseCommand):
    help = "Run the ASGI server (uvicorn, WEB_PROCESSES worker processes) in this process."

    def add_arguments(self, parser):
        parser.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"))
        parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))

    def handle(self, *args, host: str, port: int, **options) -> None:
        argv = web_server_command(host, port, web_processes())
        os.execve(argv[0], argv, child_env())
