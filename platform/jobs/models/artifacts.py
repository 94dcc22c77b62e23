"""A job's checkpoints, as the ingest stores their events, and what is made from one on a
worker: its `Export` as a model folder (jobs.exports) and its `Evaluation`s (jobs.evaluations)."""

from __future__ import annotations

from django.db import models

from engine.runtime.spec import present


class Checkpoint(models.Model):
    """One `checkpoint` event of a job (unique per job and sequence number), stored by the
    ingest (monitor.ingest) like the other event rows."""

    # as monitor's event rows: no index (the unique one starts with the job) and no
    # constraint checked at each of the ingest's inserts (monitor.models._job_key)
    job = models.ForeignKey("jobs.Job", on_delete=models.CASCADE,
                            related_name="stored_checkpoints", db_index=False,
                            db_constraint=False)
    seq = models.PositiveBigIntegerField()
    step = models.PositiveIntegerField()
    time = models.FloatField()
    path = models.CharField(max_length=1024)
    tier = models.CharField(max_length=16, blank=True, help_text='"disk" or "memory"')
    size_bytes = models.PositiveBigIntegerField(null=True)
    strategy = models.CharField(max_length=8, blank=True)
    world_size = models.PositiveIntegerField(null=True)
    blocking_s = models.FloatField(null=True, help_text="how long training waited for it")
    lineage = models.JSONField(null=True, help_text="what made it (engine.runtime.lineage); "
                                                    "null for one saved before lineages")

    @property
    def available(self) -> bool:
        """Still stored (its manifest is there: on disk, in the memory tier or in an object
        store): the engine's retention (checkpoint.keep) deletes old ones, and their rows stay
        as the job's history."""
        return present(self.path)

    @classmethod
    def stored_bytes_of(cls, owner_id: int) -> int:
        """The bytes of the owner's checkpoints still stored (retention deletes old ones)."""
        return sum(c.size_bytes or 0 for c in cls.objects.filter(
            job__owner_id=owner_id, size_bytes__gt=0) if c.available)

    class Meta:
        db_table = "monitor_checkpoint"  # the monitor app's until it moved here (jobs 0018)
        ordering = ["job", "seq"]
        constraints = [models.UniqueConstraint(fields=["job", "seq"], name="checkpoint_once")]


class ExportState(models.TextChoices):
    PENDING = "pending"  # queued for a worker
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


class Export(models.Model):
    """A checkpoint exported as a Hugging Face model folder (jobs.exports); one per checkpoint,
    whose folder an export done again rewrites."""

    checkpoint = models.OneToOneField(Checkpoint, on_delete=models.CASCADE,
                                      related_name="export")
    state = models.CharField(max_length=8, choices=ExportState.choices,
                             default=ExportState.PENDING)
    out_dir = models.CharField(max_length=1024, help_text="the model folder")
    error = models.TextField(blank=True)
    summary = models.JSONField(default=dict, blank=True,
                               help_text="engine.export's summary: files, tensors, bytes")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"export of checkpoint {self.checkpoint_id} ({self.state})"

    def record(self, state: str, *, error: str = "", summary: dict | None = None) -> None:
        self.state, self.error, self.summary = state, error, summary or {}
        self.save(update_fields=["state", "error", "summary", "updated_at"])


class Evaluation(models.Model):
    """One evaluation of a checkpoint (jobs.evaluations): held-out loss and perplexity per
    source, the user's tasks, generations. A checkpoint may be evaluated many times (other
    tasks, again); each keeps its own folder of per-item records."""

    checkpoint = models.ForeignKey(Checkpoint, on_delete=models.CASCADE,
                                   related_name="evaluations")
    # a worker's task, as an export's: the same states
    state = models.CharField(max_length=8, choices=ExportState.choices,
                             default=ExportState.PENDING)
    tasks = models.CharField(max_length=1024, blank=True,
                             help_text="the task file (JSONL) under the user's data roots; "
                                       "empty: held-out loss only")
    heldout_windows = models.PositiveIntegerField(default=32,
                                                  help_text="held-out windows per source")
    slots = models.PositiveSmallIntegerField(default=1, help_text=(
        "the most slots it uses at once: as many as no training job holds or waits for"))
    out_dir = models.CharField(max_length=1024, help_text="the per-item records and results")
    items_done = models.PositiveIntegerField(default=0)
    items_total = models.PositiveIntegerField(null=True, help_text="null until it started")
    results = models.JSONField(default=dict, blank=True,
                               help_text="engine.evaluate's summary: heldout {source: {loss, "
                                         "perplexity}}, tasks {name: scores}, generations")
    error = models.TextField(blank=True)
    automatic = models.BooleanField(default=False,
                                    help_text="queued by the job's eval.on_checkpoint")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["checkpoint", "pk"]
        constraints = [models.UniqueConstraint(  # however often its event is ingested
            fields=["checkpoint"], condition=models.Q(automatic=True),
            name="one_automatic_evaluation_per_checkpoint")]

    def __str__(self) -> str:
        return f"evaluation {self.pk} of checkpoint {self.checkpoint_id} ({self.state})"

    @property
    def progress(self) -> float | None:
        """The share of its items scored, 0 to 1; None until it started."""
        return self.items_done / self.items_total if self.items_total else None

    def record(self, state: str, *, error: str = "", results: dict | None = None) -> None:
        self.state, self.error = state, error
        if results is not None:
            self.results = results
            self.items_done, self.items_total = results["items_done"], results["items_total"]
        self.save(update_fields=["state", "error", "results", "items_done", "items_total",
                                 "updated_at"])
