from django.apps import AppConfig


class SinksConfig(AppConfig):
    name = "monitor.sinks"
    label = "sinks"
    verbose_name = "Metric sinks"
