"""What the API reads and writes: jobs and what they hold (commands, checkpoints),
a job-create body, the planner's query and answer, tokens and webhooks. The steering actions'
and a clone's bodies are in jobs.bodies."""

from __future__ import annotations

import re
from typing import Any

from rest_framework import serializers

from common.addresses import Refused, reachable
from common.text import text_error, text_errors
from engine.contract import COLLECTIVES, CommandKind, CommandRule, ProposalStatus
from engine.runtime.spec import PRESETS, ParallelSpec, SpecError, TrainSpec, parse_spec
from jobs import confinement, history
from jobs.backends import options as backend_options
from jobs.models import (
    ApiToken,
    AuditEntry,
    Checkpoint,
    Command,
    Evaluation,
    Export,
    Job,
    JobEvent,
    Reservation,
    State,
    Webhook,
)
from jobs.policy import PlatformPolicy, PolicyError
from jobs.telemetry import telemetry


class JobEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = JobEvent
        fields = ["from_state", "to_state", "cause", "actor", "message", "time"]


class PlacementSerializer(serializers.ModelSerializer):
    """One placed host of a job: its node rank (0: the lead host), the host, its slots."""

    host = serializers.CharField(source="host.name", read_only=True)

    class Meta:
        model = Reservation
        fields = ["node_rank", "host", "slots"]
        read_only_fields = fields


class JobSerializer(serializers.ModelSerializer):
    owner = serializers.CharField(source="owner.username", read_only=True)
    total_steps = serializers.IntegerField(read_only=True)
    placement = PlacementSerializer(many=True, read_only=True, help_text=(
        "the hosts it is placed on, by node rank; empty while it waits (`waiting_reason`)"))

    class Meta:
        model = Job
        fields = ["id", "name", "state", "step", "total_steps", "spec", "owner", "created_at",
                  "started_at", "finished_at", "error", "cancel_requested_at", "heartbeat_at",
                  "launches", "resume_from", "platform", "tags", "note", "priority",
                  "placement", "waiting_reason"]
        read_only_fields = fields


PRIORITY_RANGE = (-100, 100)


class JobCreateSerializer(serializers.Serializer):
    """A job-create body: the job spec itself, and beside it the platform's own fields: its
    placement `priority` (jobs.placement: higher first), its fault policy (`platform`:
    jobs.policy), its trackers (`sinks`: monitor.sinks.options) and its backend (`backend`,
    `slurm`: jobs.backends.options). Validates to the job's `spec`, `policy`, `sinks`,
    `backend` and `priority`; its errors name each bad field by its dotted path, with one
    message (the spec's own paths: `train.lr`)."""

    priority = serializers.IntegerField(
        default=0, min_value=PRIORITY_RANGE[0], max_value=PRIORITY_RANGE[1],
        help_text="placement order, higher first; waiting jobs age upwards so none starves")

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        errors: dict[str, str] = {}
        job = self._options(data if isinstance(data, dict) else {}, errors)
        unreadable = text_errors(data)
        if unreadable:  # nothing else reads a string that is not text (a path, a name)
            raise serializers.ValidationError({**errors, **unreadable})
        if isinstance(data, dict):
            data = {k: v for k, v in data.items() if k not in (*BESIDE_SPEC, *self.fields)}
        data = confinement.confine(data, self.context["request"].user, errors)
        try:
            job["spec"] = parse_spec(data).to_dict()
        except SpecError as e:
            errors.update(e.errors)
        if errors:
            raise serializers.ValidationError(errors)
        return job

    def _options(self, data: dict[str, Any], errors: dict[str, str]) -> dict[str, Any]:
        """The fields beside the spec, validated; each bad one's message added to `errors`."""
        job: dict[str, Any] = {
            "policy": PlatformPolicy(), "sinks": None,  # None: the owner's defaults
            "backend": backend_options.parse(data, _hosts_asked(data), errors)}
        try:
            job["policy"] = PlatformPolicy.parse(data.get("platform"))
        except PolicyError as e:
            errors.update(e.errors)
        if "sinks" in data:
            job["sinks"] = telemetry().parse_sinks(data["sinks"], errors)
        try:
            job.update(super().to_internal_value({k: v for k, v in data.items()
                                                  if k in self.fields}))
        except serializers.ValidationError as e:
            errors.update({k: " ".join(map(str, v)) for k, v in e.detail.items()})
        return job


# read beside the spec, not in it: the fault policy, the trackers, the backend's own options
BESIDE_SPEC = ("platform", "sinks", "backend", "slurm")


def _hosts_asked(data: dict) -> int:
    """The hosts a create body asks for, as the backend's limits count them (a malformed
    value is the spec's to report)."""
    parallel = data.get("parallel")
    hosts = parallel.get("hosts", 1) if isinstance(parallel, dict) else 1
    return hosts if isinstance(hosts, int) and not isinstance(hosts, bool) else 1


TAG = re.compile(r"^[a-z0-9][a-z0-9_.:-]{0,31}$")
MAX_TAGS = 16


class TagList(serializers.ListField):
    """A list of tags whose errors are one message for the field, as every other field's are
    (a ListField reports them per index, which the API's error schema does not describe)."""

    child = serializers.CharField(allow_blank=True)

    def run_child_validation(self, data: list) -> list[str]:
        try:
            return super().run_child_validation(data)
        except serializers.ValidationError:
            raise serializers.ValidationError("each tag must be a string") from None


class JobNoteSerializer(serializers.ModelSerializer):
    """What the owner may change on a job: its tags and note (PATCH /api/jobs/<id>/)."""

    tags = TagList(
        max_length=MAX_TAGS, required=False,
        help_text=f"at most {MAX_TAGS}; each lowercase letters, digits and `_.:-`, "
        "at most 32 characters, starting with a letter or digit")
    note = serializers.CharField(max_length=2000, allow_blank=True, required=False,
                                 trim_whitespace=True)

    class Meta:
        model = Job
        fields = ["tags", "note"]

    def validate_tags(self, tags: list[str]) -> list[str]:
        bad = [tag for tag in tags if not TAG.match(tag)]
        if bad:
            raise serializers.ValidationError(
                f"not a tag: {', '.join(map(repr, bad))} (lowercase letters, digits and "
                "`_.:-`, at most 32 characters, starting with a letter or digit)")
        return list(dict.fromkeys(tags))  # once each, in the order given

    def validate_note(self, note: str) -> str:
        error = text_error(note, prose=True)
        if error is not None:
            raise serializers.ValidationError(error)
        return note


class JobDetailSerializer(JobSerializer):
    transitions = JobEventSerializer(many=True, read_only=True)

    class Meta(JobSerializer.Meta):
        fields = [*JobSerializer.Meta.fields, "transitions"]
        read_only_fields = fields

    def get_fields(self) -> dict[str, serializers.Field]:
        # the sinks are monitor's rows, shown by monitor's serializer (jobs.telemetry)
        return {**super().get_fields(), "sinks": telemetry().sinks_field(help_text=(
            "the trackers the job writes to, how far each got and its last error "
            "(monitor.sinks)"))}


class CommandSerializer(serializers.ModelSerializer):
    class Meta:
        model = Command
        fields = ["id", "kind", "args", "state", "result", "requested_by", "created_at",
                  "updated_at"]
        read_only_fields = fields


class ExportSerializer(serializers.ModelSerializer):
    checkpoint = serializers.PrimaryKeyRelatedField(read_only=True)
    step = serializers.IntegerField(source="checkpoint.step", read_only=True)

    class Meta:
        model = Export
        fields = ["checkpoint", "step", "state", "out_dir", "error", "summary", "created_at",
                  "updated_at"]
        read_only_fields = fields


class EvaluationSerializer(serializers.ModelSerializer):
    checkpoint = serializers.PrimaryKeyRelatedField(read_only=True)
    step = serializers.IntegerField(source="checkpoint.step", read_only=True)
    progress = serializers.FloatField(read_only=True, allow_null=True, help_text=(
        "items_done of items_total, 0 to 1; null until it started (also pushed on the job's "
        "socket as `evaluation` messages while it runs)"))

    class Meta:
        model = Evaluation
        fields = ["id", "checkpoint", "step", "state", "tasks", "heldout_windows", "slots",
                  "out_dir", "automatic", "progress",
                  "items_done", "items_total", "results", "error", "created_at", "updated_at"]
        read_only_fields = fields


class CheckpointSerializer(serializers.ModelSerializer):
    available = serializers.BooleanField(
        read_only=True, help_text="still on disk; false once retention (checkpoint.keep) "
                                  "deleted it")
    export = ExportSerializer(read_only=True, allow_null=True,
                              help_text="its export as a model folder; null: never exported")
    branch = serializers.SerializerMethodField(
        help_text='"abandoned": a rollback written after it went back before its step, so it '
                  'holds a run that no longer leads to the live one; else "live"')

    class Meta:
        model = Checkpoint
        fields = ["id", "seq", "step", "time", "path", "tier", "size_bytes", "strategy",
                  "world_size", "blocking_s", "available", "export", "branch"]
        read_only_fields = fields

    def get_branch(self, checkpoint: Checkpoint) -> str:
        # the view reads the job's rollbacks once for the page; a lone checkpoint reads its own
        rollbacks = self.context.get("rollbacks")
        if rollbacks is None:
            rollbacks = history.rollbacks(checkpoint.job_id)
        return history.branch(checkpoint, rollbacks)


class AuditEntrySerializer(serializers.ModelSerializer):
    class Meta:
        model = AuditEntry
        fields = ["id", "time", "actor", "cause", "action", "job", "details"]
        read_only_fields = fields


class ProposalSerializer(serializers.Serializer):
    """A proposal of the fault policy as its latest `proposal` event tells it."""

    id = serializers.CharField()
    step = serializers.IntegerField(help_text="where it was made, or decided")
    status = serializers.ChoiceField(choices=[str(s) for s in ProposalStatus])
    action = serializers.CharField(help_text="the proposed action")
    anomaly = serializers.CharField()
    rank = serializers.IntegerField(allow_null=True, default=None)
    evidence = serializers.DictField(help_text="the anomaly's evidence")
    deadline = serializers.FloatField(help_text="wall-clock seconds since the epoch")
    default = serializers.CharField(help_text="the action taken at the deadline")
    hold = serializers.BooleanField(help_text="whether the run holds while it waits")
    take = serializers.CharField(allow_null=True, default=None, help_text="the action taken")
    by = serializers.CharField(allow_null=True, default=None,
                               help_text="who decided: a command, or the timeout")
    command = serializers.CharField(allow_null=True, default=None)


class CommandRuleSerializer(serializers.Serializer):
    """When a command may be issued, and what it does to the job (engine.contract)."""

    # the job's own state choices, so that the schema names them once (JobStateEnum)
    allowed_in = serializers.ListField(child=serializers.ChoiceField(choices=State.choices),
                                       help_text="the job states it may be issued in")
    moves_to = serializers.ChoiceField(
        choices=State.choices, allow_null=True,
        help_text="the state the job takes while it is carried out; null: it keeps its state")

    def to_representation(self, rule: CommandRule) -> dict[str, Any]:
        data = super().to_representation(rule)
        data["allowed_in"].sort(key=State.values.index)  # lifecycle order (a set has none)
        return data


class CommandRulesSerializer(serializers.Serializer):
    """Every command kind's rule, by kind."""

    def get_fields(self) -> dict[str, serializers.Field]:
        return {str(kind): CommandRuleSerializer() for kind in CommandKind}


class PlanQuery(serializers.Serializer):
    """A model, a batch and a layout to plan; checked as a job spec with them would be, so
    the bounds and messages are the spec's own (`train.seq_len: must be at most ...`)."""

    preset = serializers.ChoiceField(choices=sorted(PRESETS), default="tiny")
    model = serializers.JSONField(binary=True, default=dict,
                                  help_text="MoEConfig fields over the preset, a JSON object")
    nodes = serializers.IntegerField(default=ParallelSpec.nodes)
    procs_per_node = serializers.IntegerField(default=ParallelSpec.procs_per_node)
    hosts = serializers.IntegerField(default=ParallelSpec.hosts,
                                     help_text="the hosts the nodes are spread over")
    micro_batch = serializers.IntegerField(default=TrainSpec.micro_batch)
    seq_len = serializers.IntegerField(default=TrainSpec.seq_len)
    grad_accum = serializers.IntegerField(default=TrainSpec.grad_accum)
    collective = serializers.ChoiceField(choices=COLLECTIVES, default="native")
    memory_budget_gb = serializers.FloatField(min_value=0, max_value=1e6, default=16.0,
                                              help_text="model-state memory per device")

    def validate_model(self, value: Any) -> dict:
        if not isinstance(value, dict):
            raise serializers.ValidationError("must be a JSON object of model fields")
        return value

    def validate(self, data: dict) -> dict:
        try:
            data["spec"] = parse_spec({
                "name": "plan", "model": {**data["model"], "preset": data["preset"]},
                "parallel": {"nodes": data["nodes"], "procs_per_node": data["procs_per_node"],
                             "hosts": data["hosts"], "collective": data["collective"]},
                "train": {k: data[k] for k in ("micro_batch", "seq_len", "grad_accum")},
            })
        except SpecError as e:  # named by the query parameter that holds the field
            raise serializers.ValidationError(
                {_PLAN_PARAMS.get(k, k): v for k, v in e.errors.items()}) from None
        return data


# spec field -> the query parameter it comes from (model fields keep their spec names)
_PLAN_PARAMS = {"model.preset": "preset", "parallel.nodes": "nodes",
                "parallel.procs_per_node": "procs_per_node", "parallel.hosts": "hosts",
                "parallel.collective": "collective",
                "train.micro_batch": "micro_batch", "train.seq_len": "seq_len",
                "train.grad_accum": "grad_accum"}


class MemoryBytes(serializers.Serializer):
    params = serializers.FloatField()
    grads = serializers.FloatField()
    optim = serializers.FloatField()
    total = serializers.FloatField()


class PlanRowSerializer(serializers.Serializer):
    strategy = serializers.CharField()
    names = serializers.ListField(child=serializers.CharField(), help_text=(
        "every strategy this row stands for: on one node those that differ only in I for G "
        "run the same (NGG = NII = NIG)"))
    memory_bytes = MemoryBytes()
    step_time_s = serializers.FloatField(allow_null=True,
                                         help_text="compute + communication + optimizer")
    compute_time_s = serializers.FloatField(allow_null=True)
    comm_time_s = serializers.FloatField()
    tokens_per_s = serializers.FloatField(allow_null=True)
    compute_source = serializers.CharField(help_text=(
        'where compute came from: "measured: job 12", "calibrated matmul rate 35 GFLOP/s" '
        'or "unknown: ..." (then no step time)'))
    link_source = serializers.CharField(help_text=(
        'the link between nodes communication is priced on: "between nodes: this host\'s", '
        'or on several hosts "between hosts: 0.94 Gbit/s, measured: job 12" (or why unknown)'))
    fits = serializers.BooleanField()


class PlanSerializer(serializers.Serializer):
    memory_budget_bytes = serializers.FloatField()
    refused = serializers.CharField(allow_null=True, help_text=(
        "why a job of this model and layout would be refused: no registered host's devices "
        "hold its state in any strategy (jobs.admission); null: admitted"))
    plans = PlanRowSerializer(many=True, help_text="best first: those that fit, fastest first")


class ApiTokenSerializer(serializers.ModelSerializer):
    class Meta:
        model = ApiToken
        fields = ["id", "name", "created", "last_used", "revoked"]
        read_only_fields = ["id", "created", "last_used", "revoked"]


class NewApiTokenSerializer(ApiTokenSerializer):
    """Only the answer to creating a token shows its key (the server keeps only its digest)."""

    key = serializers.CharField(read_only=True, help_text="shown in this answer only")

    class Meta(ApiTokenSerializer.Meta):
        fields = [*ApiTokenSerializer.Meta.fields, "key"]
        read_only_fields = [*ApiTokenSerializer.Meta.read_only_fields, "key"]


class WebhookSerializer(serializers.ModelSerializer):
    job = serializers.PrimaryKeyRelatedField(
        queryset=Job.objects.all(), required=False, allow_null=True,
        help_text="one of your jobs; leave out for all of them")

    class Meta:
        model = Webhook
        fields = ["id", "url", "job", "created", "last_status"]
        read_only_fields = ["id", "created", "last_status"]
        extra_kwargs = {
            "url": {"help_text": "http(s) to a public address (or one the operator allows)"},
            "last_status": {"help_text": 'how the last delivery went: "delivered", "refused by '
                            'the receiver (HTTP <code>)", "unreachable" or "refused: not a '
                            'public address" (the host resolved to one when it was sent)'}}

    def validate_url(self, url: str) -> str:
        try:
            reachable(url)
        except Refused as e:
            raise serializers.ValidationError(str(e)) from e
        return url

    def validate_job(self, job: Job | None) -> Job | None:
        from jobs.permissions import visible_jobs

        if job is not None and not visible_jobs(self.context["request"].user).filter(
                pk=job.pk).exists():
            raise serializers.ValidationError(f'Invalid pk "{job.pk}" - object does not exist.')
        return job


class NewWebhookSerializer(WebhookSerializer):
    """Only the answer to creating a webhook shows its signing secret."""

    class Meta(WebhookSerializer.Meta):
        fields = [*WebhookSerializer.Meta.fields, "secret"]
        read_only_fields = [*WebhookSerializer.Meta.read_only_fields, "secret"]
