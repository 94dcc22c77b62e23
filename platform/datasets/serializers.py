"""What the datasets API reads and writes; a registration's paths are checked here against the
user's data roots (datasets.sources)."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers
from rest_framework.settings import api_settings

from common.text import text_errors
from datasets.models import Dataset
from datasets.sources import KINDS, confined_sources, tokenizer_path

NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
MAX_SOURCES, MAX_PATHS = 16, 64


class SourceSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(choices=KINDS, help_text="text: each file one document; "
                                   "jsonl: each line's `field`; parquet: the column `field`")
    paths = serializers.ListField(
        child=serializers.CharField(), min_length=1, max_length=MAX_PATHS,
        help_text="files or globs under your data roots (relative: in your uploads), or an "
                  "object-store prefix the operator opened")
    field = serializers.CharField(default="text", max_length=128,
                                  help_text="the JSONL field or Parquet column of the text")


class DatasetSerializer(serializers.ModelSerializer):
    owner = serializers.CharField(source="owner.username", read_only=True)
    sources = SourceSerializer(many=True)
    vocab_size = serializers.IntegerField(read_only=True, allow_null=True,
                                          help_text="the tokenizer's, once prepared")
    in_use_by = serializers.SerializerMethodField(
        help_text="the unfinished jobs training on it (it cannot be deleted while any is)")

    class Meta:
        model = Dataset
        fields = ["id", "name", "owner", "shared", "sources", "tokenizer", "holdout", "state",
                  "error", "progress", "manifest", "vocab_size", "created_at", "prepared_at",
                  "in_use_by"]
        read_only_fields = ["id", "owner", "state", "error", "progress", "manifest",
                            "vocab_size", "created_at", "prepared_at", "in_use_by"]
        extra_kwargs = {
            "name": {"help_text": "unique among yours; what a job's train.data.mix names"},
            "shared": {"help_text": "every user may train on it (staff only)"},
            "tokenizer": {"help_text": "`bytes`, a tokenizer.json, or a Hugging Face tokenizer "
                                       "folder, under your data roots"},
            "holdout": {"help_text": "the fraction of documents held out for evaluation"}}

    def get_in_use_by(self, dataset: Dataset) -> list[int]:
        return list(dataset.active_jobs().values_list("pk", flat=True))


class DatasetBody(DatasetSerializer):
    """A registration: every path is resolved to its real path under the user's data roots;
    what lies outside answers 400 naming the field, the same whether it exists or not."""

    name = serializers.RegexField(NAME, help_text="letters, digits, `_.-`; unique among yours")
    sources = SourceSerializer(many=True, allow_empty=False, max_length=MAX_SOURCES)
    holdout = serializers.FloatField(default=0.01, min_value=0.0001, max_value=0.5)

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        unreadable = text_errors(data)
        if unreadable:  # nothing reads a string that is not text as a path or a name
            raise serializers.ValidationError(unreadable)
        return super().to_internal_value(data)

    def validate_shared(self, shared: bool) -> bool:
        if shared and not self.context["request"].user.is_staff:
            raise serializers.ValidationError("only staff share a dataset with everyone")
        return shared

    def validate(self, data: dict[str, Any]) -> dict[str, Any]:
        user, errors = self.context["request"].user, {}
        if Dataset.objects.filter(owner=user, name=data["name"]).exists():
            errors["name"] = f"you have a dataset named {data['name']!r} already"
        data["sources"] = confined_sources(data["sources"], user, errors)
        data["tokenizer"] = tokenizer_path(data.get("tokenizer", "bytes"), user, "tokenizer",
                                           errors)
        if errors:
            raise serializers.ValidationError(errors)
        return data


class SharedBody(serializers.ModelSerializer):
    """What staff change on a dataset: whether everyone may train on it."""

    class Meta:
        model = Dataset
        fields = ["shared"]


class PrepareBody(serializers.Serializer):
    """Prepare (or resume preparing) the dataset on a worker; no fields."""


def dotted(errors: Any, field: str = "") -> dict[str, list[str]]:
    """DRF's nested errors (`{"sources": [{}, {"kind": [...]}]}`) by dotted field
    (`sources.1.kind`), as the spec's errors are named; a nested object's own errors go to
    the field that holds it."""
    if isinstance(errors, dict):
        found: dict[str, list[str]] = {}
        for key, inner in errors.items():
            own = key in ("non_field_errors", api_settings.NON_FIELD_ERRORS_KEY) and field
            found.update(dotted(inner, field if own else f"{field}.{key}".lstrip(".")))
        return found
    if isinstance(errors, list) and errors and not all(isinstance(e, str) for e in errors):
        return {k: v for i, inner in enumerate(errors)
                for k, v in dotted(inner, f"{field}.{i}").items()}
    return {field: [str(e) for e in errors]} if errors else {}
