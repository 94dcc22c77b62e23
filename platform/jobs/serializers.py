"""What the API reads and writes. Request bodies are validated here, field by field."""

from __future__ import annotations

import re
from typing import Any

from django.conf import settings
from rest_framework import serializers
from rest_framework.settings import api_settings

from common.addresses import Refused, reachable
from common.text import text_error
from engine.contract import (
    COLLECTIVES,
    STRATEGIES,
    CheckpointTier,
    Choice,
    CommandKind,
    CommandRule,
    PauseMode,
    ProposalStatus,
    ShareMode,
)
from engine.runtime.spec import (
    LADDER_ACTIONS,
    PRESETS,
    ParallelSpec,
    SpecError,
    TrainSpec,
    parse_spec,
    resharded,
    share_errors,
    validate_settings,
)
from jobs.models import (
    ApiToken,
    AuditEntry,
    Command,
    Evaluation,
    Export,
    Job,
    JobEvent,
    Reservation,
    State,
    Webhook,
)
from monitor.models import Action, Anomaly, Checkpoint
from monitor.sinks.api import SinkSerializer


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


class JobOptions(serializers.Serializer):
    """The platform's own fields of a job-create body, beside the spec: its placement
    priority (jobs.placement: higher first)."""

    priority = serializers.IntegerField(
        default=0, min_value=PRIORITY_RANGE[0], max_value=PRIORITY_RANGE[1],
        help_text="placement order, higher first; waiting jobs age upwards so none starves")


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
    sinks = SinkSerializer(many=True, read_only=True, help_text=(
        "the trackers the job writes to, how far each got and its last error (monitor.sinks)"))

    class Meta(JobSerializer.Meta):
        fields = [*JobSerializer.Meta.fields, "transitions", "sinks"]
        read_only_fields = fields


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

    class Meta:
        model = Evaluation
        fields = ["id", "checkpoint", "step", "state", "tasks", "heldout_windows", "slots",
                  "out_dir",
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
            rollbacks = job_rollbacks(checkpoint.job_id)
        return branch(checkpoint, rollbacks)


def job_rollbacks(job_id: int) -> list[tuple[int, int]]:
    """(seq, to_step) of each rollback the engine carried out for the job."""
    found = Action.objects.filter(job_id=job_id, action="rollback").values_list("seq", "details")
    return [(seq, details["to_step"]) for seq, details in found if "to_step" in details]


def branch(checkpoint: Checkpoint, rollbacks: list[tuple[int, int]]) -> str:
    """"abandoned" when a later rollback (by event seq) went back to before the checkpoint's
    step: training went on from an older state, and the steps it saved were trained again."""
    abandoned = any(seq > checkpoint.seq and to_step < checkpoint.step
                    for seq, to_step in rollbacks)
    return "abandoned" if abandoned else "live"


def job_checkpoint(job: Job, checkpoint_id: int) -> Checkpoint:
    """One of `job`'s checkpoints that still exists, or a ValidationError saying why not."""
    found = Checkpoint.objects.filter(job=job, pk=checkpoint_id).first()
    if found is None:
        raise serializers.ValidationError(f"job {job.pk} has no checkpoint {checkpoint_id}")
    if not found.available:
        raise serializers.ValidationError(
            f"checkpoint {checkpoint_id} (step {found.step}) was deleted by the job's "
            f"retention (checkpoint.keep); pick a newer one")
    return found


class AnomalySerializer(serializers.ModelSerializer):
    class Meta:
        model = Anomaly
        fields = ["id", "seq", "step", "time", "kind", "severity", "rank", "evidence"]
        read_only_fields = fields


class AuditEntrySerializer(serializers.ModelSerializer):
    class Meta:
        model = AuditEntry
        fields = ["id", "time", "actor", "cause", "action", "job", "details"]
        read_only_fields = fields


class CommandBody(serializers.Serializer):
    """A command's body; pause, resume, cancel and checkpoint have no fields."""

    def validate(self, data: dict[str, Any]) -> dict[str, Any]:
        # what jobs.steering.issue takes: the args stored on the command as the user gave
        # them, and the same command as the engine takes it
        return {"args": data, "engine_args": data}


class PauseBody(CommandBody):
    mode = serializers.ChoiceField(
        choices=[str(m) for m in PauseMode], required=False,
        help_text="cold (default): checkpoint and stop, freeing the worker; warm: the ranks "
                  "idle with their state in memory, and resume goes on within a second")
    max_s = serializers.FloatField(
        required=False, min_value=1, max_value=7 * 24 * 3600,
        help_text="warm: how long it may stay warm before it turns cold (default: the "
                  "platform's JOB_WARM_PAUSE_MAX_S)")

    def validate(self, data: dict[str, Any]) -> dict[str, Any]:
        if data.get("mode") != PauseMode.WARM:
            if "max_s" in data:
                raise serializers.ValidationError({"max_s": "only a warm pause has a limit"})
            return super().validate(data)
        # the engine is told the limit, the platform's default when the body gives none
        return {"args": data, "engine_args": {
            "mode": PauseMode.WARM, "max_s": data.get("max_s", settings.JOB_WARM_PAUSE_MAX_S)}}


class RollbackBody(CommandBody):
    checkpoint = serializers.IntegerField(
        required=False, min_value=1,
        help_text="the id of one of this job's checkpoints (GET .../checkpoints/)")
    step = serializers.IntegerField(
        required=False, min_value=0, help_text="go back to the newest checkpoint at or before")
    skip_data = serializers.BooleanField(
        default=False, help_text="skip the data window since that checkpoint")
    keep_settings = serializers.BooleanField(
        required=False, help_text="false: take the checkpoint's live settings (`set`) "
                                  "rather than keep the current ones")

    def validate(self, data: dict[str, Any]) -> dict[str, Any]:
        if ("checkpoint" in data) == ("step" in data):
            raise serializers.ValidationError(
                {"checkpoint": "give exactly one of checkpoint and step"})
        engine_args: dict[str, Any] = {"skip_data": data["skip_data"]}
        if "keep_settings" in data:
            engine_args["keep_settings"] = data["keep_settings"]
        if "checkpoint" in data:
            try:
                found = job_checkpoint(self.context["job"], data["checkpoint"])
            except serializers.ValidationError as e:
                raise serializers.ValidationError({"checkpoint": e.detail}) from e
            # the engine knows checkpoints by their folder, not by the platform's ids
            engine_args["checkpoint"] = found.path
        else:
            engine_args["step"] = data["step"]
        return {"args": data, "engine_args": engine_args}


class ReshardBody(CommandBody):
    strategy = serializers.ChoiceField(choices=STRATEGIES, help_text="a PaRO strategy")
    nodes = serializers.IntegerField(min_value=1)
    procs_per_node = serializers.IntegerField(min_value=1)

    def validate(self, data: dict[str, Any]) -> dict[str, Any]:
        try:  # the engine's own rules for a reshard (layout, batch over the ranks)
            resharded(self.context["job"].spec, data)
        except SpecError as e:
            raise serializers.ValidationError(
                {k.removeprefix("parallel."): v for k, v in e.errors.items()}) from e
        return super().validate(data)


class RebalanceBody(CommandBody):
    shares = serializers.JSONField(
        required=False, default=ShareMode.AUTO.value,
        help_text="samples of each step's global batch per data-parallel rank (a list that "
                  "sums to micro_batch x ranks x grad_accum, at least grad_accum each, pinned "
                  "until the next rebalance); \"auto\" (default): follow the ranks' measured "
                  "speeds; \"even\": back to even shares")

    def validate(self, data: dict[str, Any]) -> dict[str, Any]:
        spec = parse_spec(self.context["job"].spec)  # the job's layout now (after reshards)
        p, t = spec.parallel, spec.train
        shares = data["shares"]
        if p.world_size < 2:
            raise serializers.ValidationError(
                {"shares": "the job has one data-parallel rank; there is no other rank to "
                           "share its batch with"})
        if shares not in tuple(ShareMode):
            error = share_errors(shares, p.world_size, t.micro_batch * p.world_size
                                 * t.grad_accum, t.grad_accum)
            if error is not None:
                raise serializers.ValidationError(
                    {"shares": f"{error} (or {ShareMode.AUTO.value!r} or "
                               f"{ShareMode.EVEN.value!r})"})
        return super().validate({"shares": shares})


class SetBody(CommandBody):
    """Live settings as a flat object of dotted spec keys, e.g. `{"train.lr": 0.001,
    "checkpoint.every": 20}`, checked by the engine's own validator
    (engine.runtime.spec.validate_settings)."""

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        return dict(data)  # the keys are dotted paths, not fields of this serializer

    def validate(self, data: dict[str, Any]) -> dict[str, Any]:
        try:
            values = validate_settings(data)
        except SpecError as e:
            raise serializers.ValidationError(
                {k or api_settings.NON_FIELD_ERRORS_KEY: v for k, v in e.errors.items()}) from e
        return {"args": data, "engine_args": values}


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


class DecideBody(CommandBody):
    """A person's answer to a proposal of the fault policy (the proposal named in the URL)."""

    choice = serializers.ChoiceField(
        choices=[str(c) for c in Choice],
        help_text="approve: take the proposed action; choose: take `action` instead; dismiss: "
                  "neither (the run observes)")
    action = serializers.ChoiceField(choices=list(LADDER_ACTIONS), required=False,
                                     help_text="choose: the action to take")

    def validate(self, data: dict[str, Any]) -> dict[str, Any]:
        if (data["choice"] == Choice.CHOOSE) != ("action" in data):
            raise serializers.ValidationError(
                {"action": f"needed with choice {Choice.CHOOSE}, and only with it"})
        return super().validate({"proposal": self.context["proposal"], **data})


class CloneBody(serializers.Serializer):
    name = serializers.RegexField(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$", required=False,
                                  help_text="default: the original's name")
    checkpoint = serializers.IntegerField(
        required=False, min_value=1,
        help_text="start from this checkpoint of the original (a disk checkpoint's id)")

    def validate_checkpoint(self, value: int) -> Checkpoint:
        found = job_checkpoint(self.context["job"], value)
        if found.tier == CheckpointTier.MEMORY:
            raise serializers.ValidationError("a memory-tier checkpoint cannot seed a clone; "
                                              "pick a disk one")
        return found

    def validate(self, data: dict[str, Any]) -> dict[str, Any]:
        # what the new job takes: its name, and the checkpoint it starts from (empty: afresh)
        found = data.get("checkpoint")
        return {"name": data.get("name", self.context["job"].name),
                "resume_from": found.path if found else ""}


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
