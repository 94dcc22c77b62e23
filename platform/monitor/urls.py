"""REST routes of the telemetry reads, under /api/: a job's metrics and goodput are actions
under the jobs API's own routes (`jobs/<id>/metrics/`, named `job-metrics` as its actions are),
the rest views of their own."""

from django.urls import path
from rest_framework.routers import DefaultRouter

from monitor.api import (
    BadBatchesView,
    CheckpointLineageView,
    ExpertsView,
    GoodputMetricsView,
    GoodputSummaryView,
    JobTelemetryViewSet,
    OpsHistoryView,
    OpsView,
)

# the project's router (ringside.urls) answers /api/ itself, and holds the `job` basename
router = DefaultRouter()
router.include_root_view = False
router.register("jobs", JobTelemetryViewSet, basename="job")

urlpatterns = [
    path("jobs/<int:job_id>/ops/", OpsView.as_view(), name="job-ops"),
    path("jobs/<int:job_id>/ops/history/", OpsHistoryView.as_view(), name="job-ops-history"),
    path("jobs/<int:job_id>/experts/", ExpertsView.as_view(), name="job-experts"),
    path("jobs/<int:job_id>/bad-batches/", BadBatchesView.as_view(), name="job-bad-batches"),
    path("checkpoints/<int:checkpoint_id>/lineage/", CheckpointLineageView.as_view(),
         name="checkpoint-lineage"),
    path("goodput/", GoodputSummaryView.as_view(), name="goodput-summary"),
    path("goodput/metrics/", GoodputMetricsView.as_view(), name="goodput-metrics"),
    *router.urls,
]
