from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "jobs"
    verbose_name = "Training jobs"

    def ready(self) -> None:
        # a host that registers, comes back or is undrained may fit a waiting job
        from hosts.signals import host_available
        from jobs.dispatch import send_schedule

        host_available.connect(lambda **_: send_schedule(), weak=False,
                               dispatch_uid="jobs-schedule-on-host")
