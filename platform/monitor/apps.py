from django.apps import AppConfig


class MonitorConfig(AppConfig):
    name = "monitor"
    verbose_name = "Telemetry"

    def ready(self) -> None:
        from monitor import signals  # noqa: F401  (connects the state-change push)
