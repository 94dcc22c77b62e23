from django.contrib import admin

from jobs.models import Job, JobEvent, Quota


class JobEventInline(admin.TabularInline):
    model = JobEvent
    extra = 0
    readonly_fields = ["from_state", "to_state", "cause", "actor", "message", "time"]


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    list_display = ["id", "name", "owner", "state", "step", "created_at"]
    list_filter = ["state"]
    # state changes go through the model's transitions, never through a form
    readonly_fields = ["state", "step", "started_at", "finished_at", "error"]
    inlines = [JobEventInline]


@admin.register(Quota)
class QuotaAdmin(admin.ModelAdmin):
    list_display = ["user", "jobs", "slots", "checkpoint_bytes"]
