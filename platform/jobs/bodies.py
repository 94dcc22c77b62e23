"""The request bodies of a job's actions: the steering commands' and a clone's.

A command's body validates to the command's args as they are stored, what the user gave (with
the defaults filled in); `engine_args()` gives the same command as the engine takes it (a
checkpoint by its folder rather than its id, a warm pause with its limit). Each body is checked
against its job, in the serializer context's `job`.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from rest_framework import serializers
from rest_framework.settings import api_settings

from engine.contract import STRATEGIES, CheckpointTier, Choice, PauseMode, ShareMode
from engine.runtime.spec import (
    LADDER_ACTIONS,
    SpecError,
    parse_spec,
    reshard_layout,
    resharded,
    share_errors,
    validate_settings,
)
from jobs.models import Checkpoint, Job


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


class CommandBody(serializers.Serializer):
    """A command's body; pause, resume, cancel and checkpoint have no fields."""

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        if not isinstance(data, dict):
            raise serializers.ValidationError(
                {api_settings.NON_FIELD_ERRORS_KEY: ["the body must be a JSON object"]})
        return super().to_internal_value(data)

    def engine_args(self) -> dict[str, Any]:
        """The command as the engine takes it (jobs.commands.issue)."""
        return dict(self.validated_data)


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
        if data.get("mode") != PauseMode.WARM and "max_s" in data:
            raise serializers.ValidationError({"max_s": "only a warm pause has a limit"})
        return data

    def engine_args(self) -> dict[str, Any]:
        data = self.validated_data
        if data.get("mode") != PauseMode.WARM:
            return dict(data)
        # the engine is told the limit, the platform's default when the body gives none
        return {"mode": PauseMode.WARM,
                "max_s": data.get("max_s", settings.JOB_WARM_PAUSE_MAX_S)}


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
        if "checkpoint" in data:
            try:
                found = job_checkpoint(self.context["job"], data["checkpoint"])
            except serializers.ValidationError as e:
                raise serializers.ValidationError({"checkpoint": e.detail}) from e
            # the engine knows checkpoints by their folder, not by the platform's ids
            self._checkpoint_folder = found.path
        return data

    def engine_args(self) -> dict[str, Any]:
        engine = dict(self.validated_data)
        if "checkpoint" in engine:
            engine["checkpoint"] = self._checkpoint_folder  # validate() found it
        return engine


class ReshardBody(CommandBody):
    strategy = serializers.ChoiceField(choices=STRATEGIES, help_text="a PaRO strategy")
    nodes = serializers.IntegerField(min_value=1)
    procs_per_node = serializers.IntegerField(min_value=1)
    hosts = serializers.IntegerField(
        min_value=1, required=False,
        help_text="a Slurm job only: its Slurm nodes (another count is a new submission)")

    def validate(self, data: dict[str, Any]) -> dict[str, Any]:
        job = self.context["job"]
        spec = parse_spec(job.spec)
        hosts = spec.parallel.hosts
        if data.get("hosts", hosts) != hosts and job.backend != "slurm":
            # another allocation's size is a new submission, which only Slurm's jobs take
            raise serializers.ValidationError(
                {"hosts": "only a job on the slurm backend changes its host count in a reshard"})
        try:  # the engine's own rules for a reshard (layout, batch over the ranks)
            resharded(spec, reshard_layout(spec, data))
        except SpecError as e:
            raise serializers.ValidationError(
                {k.removeprefix("parallel."): v for k, v in e.errors.items()}) from e
        return data


class RebalanceBody(CommandBody):
    shares = serializers.JSONField(
        required=False, default=ShareMode.AUTO.value,
        help_text="samples of each step's global batch per data-parallel rank (a list that "
                  "sums to micro_batch x ranks x grad_accum, at least grad_accum each, pinned "
                  "until the next rebalance); \"auto\" (default): follow the ranks' measured "
                  "speeds; \"even\": back to even shares")

    def validate_shares(self, shares: Any) -> Any:
        spec = parse_spec(self.context["job"].spec)  # the job's layout now (after reshards)
        p, t = spec.parallel, spec.train
        if p.world_size < 2:
            raise serializers.ValidationError(
                "the job has one data-parallel rank; there is no other rank to share its "
                "batch with")
        if shares not in tuple(ShareMode):
            error = share_errors(shares, p.world_size, t.micro_batch * p.world_size
                                 * t.grad_accum, t.grad_accum)
            if error is not None:
                raise serializers.ValidationError(
                    f"{error} (or {ShareMode.AUTO.value!r} or {ShareMode.EVEN.value!r})")
        return shares


class SetBody(CommandBody):
    """Live settings as a flat object of dotted spec keys, e.g. `{"train.lr": 0.001,
    "checkpoint.every": 20}`, checked by the engine's own validator
    (engine.runtime.settings)."""

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        super().to_internal_value(data)  # a JSON object
        return dict(data)  # the keys are dotted paths, not fields of this serializer

    def validate(self, data: dict[str, Any]) -> dict[str, Any]:
        try:
            validate_settings(data)
        except SpecError as e:
            raise serializers.ValidationError(
                {k or api_settings.NON_FIELD_ERRORS_KEY: v for k, v in e.errors.items()}) from e
        return data

    def engine_args(self) -> dict[str, Any]:
        # the values as they are applied (an int where the spec has a float becomes a float)
        return validate_settings(self.validated_data)


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
        return {"proposal": self.context["proposal"], **data}  # the URL's (JobViewSet)


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
