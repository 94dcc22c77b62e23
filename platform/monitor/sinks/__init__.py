"""Metric sinks: a job's events written to the trackers its owner already uses.

A job names its sinks when it is created (`sinks` beside the spec, or its owner's defaults;
`options`): `tensorboard` (event files in the job's run folder), `mlflow` (one run per job on a
tracking server) and `wandb` (offline files for `wandb sync`, or online). Each is one `Sink`
row and, while the job runs, one thread in its supervisor's process (`consumer`) that reads
the job's event stream with a consumer group of its own: the sink's tracker (`trackers`) gets
what the events say (`records`), and an entry is acknowledged only once the tracker took it,
so a tracker that is slow or down never holds training or the ingest, and loses nothing: once
it is back its consumer re-reads what it left pending. Tokens a tracker needs live encrypted
per user (`secrets`), never in the spec or the events.
"""
