from django.apps import AppConfig


class HostsConfig(AppConfig):
    name = "hosts"
    verbose_name = "Worker hosts"
