from rest_framework import serializers

from jobs.models import Job, JobEvent


class JobEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = JobEvent
        fields = ["from_state", "to_state", "cause", "actor", "message", "time"]


class JobSerializer(serializers.ModelSerializer):
    owner = serializers.CharField(source="owner.username", read_only=True)
    total_steps = serializers.IntegerField(read_only=True)

    class Meta:
        model = Job
        fields = ["id", "name", "state", "step", "total_steps", "spec", "owner", "created_at",
                  "started_at", "finished_at", "error", "cancel_requested_at"]
        read_only_fields = fields


class JobDetailSerializer(JobSerializer):
    transitions = JobEventSerializer(many=True, read_only=True)

    class Meta(JobSerializer.Meta):
        fields = [*JobSerializer.Meta.fields, "transitions"]
        read_only_fields = fields
