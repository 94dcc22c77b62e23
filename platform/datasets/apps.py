from django.apps import AppConfig


class DatasetsConfig(AppConfig):
    name = "datasets"
    verbose_name = "Datasets"

    def ready(self) -> None:
        from datasets import mix
        from jobs.mixtures import mixtures

        mixtures.provide(mix)
