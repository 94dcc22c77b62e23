from django.apps import AppConfig


class MonitorConfig(AppConfig):
    name = "monitor"
    verbose_name = "Telemetry"

    def ready(self) -> None:
        import monitor.signals  # noqa: F401  (connects the state-change push)
        from jobs.telemetry import telemetry
        from monitor import provided

        telemetry.provide(provided)
