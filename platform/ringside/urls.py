from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.routers import DefaultRouter

from jobs import views
from jobs.api import JobViewSet, TokenView

# API names ("job-list", "job-detail", ...) come from the router; pages have their own.
router = DefaultRouter()
router.register("jobs", JobViewSet, basename="job")

urlpatterns = [
    path("", views.job_list, name="home"),
    path("jobs/new/", views.job_new, name="new-job"),
    path("jobs/<int:job_id>/", views.job_detail, name="job-page"),
    path("login/", auth_views.LoginView.as_view(template_name="login.html"), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("api/auth/token/", TokenView.as_view(), name="api-token"),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    path("api/", include(router.urls)),
]
