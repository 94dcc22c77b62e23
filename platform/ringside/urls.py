from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.routers import DefaultRouter

from datasets.api import DatasetViewSet
from datasets.views import datasets_page
from hosts.api import HostViewSet
from hosts.views import hosts_page
from jobs import views
from jobs.access_api import ApiTokenViewSet, AuditView, TokenView, WebhookViewSet
from jobs.api import CommandRulesView, JobViewSet
from jobs.files import FilesView
from jobs.login import LoginView
from jobs.plan_api import PlanView
from jobs.tokens import tokens_page
from monitor.sinks.api import SecretListView, SecretView, SinkDefaultsView

# API names ("job-list", "job-detail", ...) come from the router; pages have their own.
router = DefaultRouter()
router.register("jobs", JobViewSet, basename="job")
router.register("tokens", ApiTokenViewSet, basename="token")
router.register("webhooks", WebhookViewSet, basename="webhook")
router.register("hosts", HostViewSet, basename="host")
router.register("datasets", DatasetViewSet, basename="dataset")

urlpatterns = [
    path("", views.job_list, name="home"),
    path("jobs/new/", views.job_new, name="new-job"),
    path("jobs/<int:job_id>/", views.job_detail, name="job-page"),
    path("compare/", views.compare, name="compare"),
    path("hosts/", hosts_page, name="hosts"),
    path("datasets/", datasets_page, name="datasets"),
    path("login/", LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("tokens/", tokens_page, name="tokens"),
    path("api/auth/token/", TokenView.as_view(), name="api-token"),
    path("api/plan/", PlanView.as_view(), name="api-plan"),
    path("api/commands/", CommandRulesView.as_view(), name="api-commands"),
    path("api/audit/", AuditView.as_view(), name="api-audit"),
    path("api/files/", FilesView.as_view(), name="api-files"),
    path("api/me/sinks/", SinkDefaultsView.as_view(), name="api-sink-defaults"),
    path("api/me/secrets/", SecretListView.as_view(), name="api-secrets"),
    path("api/me/secrets/<str:name>/", SecretView.as_view(), name="api-secret"),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    path("api/", include("monitor.urls")),  # telemetry reads: metrics, goodput, ops, ...
    path("api/", include(router.urls)),
]
