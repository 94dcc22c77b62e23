"""REST routes of the telemetry reads, under /api/ (the metrics action is the jobs API's)."""

from django.urls import path

from monitor.api import ExpertsView, OpsHistoryView, OpsView

urlpatterns = [
    path("jobs/<int:job_id>/ops/", OpsView.as_view(), name="job-ops"),
    path("jobs/<int:job_id>/ops/history/", OpsHistoryView.as_view(), name="job-ops-history"),
    path("jobs/<int:job_id>/experts/", ExpertsView.as_view(), name="job-experts"),
]
