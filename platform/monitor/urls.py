"""REST routes of the telemetry reads, under /api/ (the metrics and goodput actions are the jobs
API's)."""

from django.urls import path

from monitor.api import (
    BadBatchesView,
    CheckpointLineageView,
    ExpertsView,
    GoodputMetricsView,
    GoodputSummaryView,
    OpsHistoryView,
    OpsView,
)

urlpatterns = [
    path("jobs/<int:job_id>/ops/", OpsView.as_view(), name="job-ops"),
    path("jobs/<int:job_id>/ops/history/", OpsHistoryView.as_view(), name="job-ops-history"),
    path("jobs/<int:job_id>/experts/", ExpertsView.as_view(), name="job-experts"),
    path("jobs/<int:job_id>/bad-batches/", BadBatchesView.as_view(), name="job-bad-batches"),
    path("checkpoints/<int:checkpoint_id>/lineage/", CheckpointLineageView.as_view(),
         name="checkpoint-lineage"),
    path("goodput/", GoodputSummaryView.as_view(), name="goodput-summary"),
    path("goodput/metrics/", GoodputMetricsView.as_view(), name="goodput-metrics"),
]
