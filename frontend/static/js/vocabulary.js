// The names that cross the engine/platform seam, from engine/contract.py, and the
// spec's defaults, from engine/runtime/spec.py.
// Written by `manage.py vocabulary` (platform/ringside/vocabulary.py): do not edit.
export const AnomalyKind = Object.freeze({
  "NAN": "nan",
  "LOSS_SPIKE": "loss_spike",
  "GRAD_SPIKE": "grad_spike",
  "THROUGHPUT_DROP": "throughput_drop",
  "STRAGGLER": "straggler",
  "HANG": "hang",
  "EXPERT_COLLAPSE": "expert_collapse",
  "MEMORY_GROWTH": "memory_growth",
  "CRASH": "crash",
  "SDC_SUSPECT": "sdc_suspect",
  "HOST_LOST": "host_lost",
  "CHECKPOINT_CORRUPT": "checkpoint_corrupt"
});
export const ActionName = Object.freeze({
  "OBSERVE": "observe",
  "RESUME": "resume",
  "REBALANCE": "rebalance",
  "RERUN": "rerun",
  "SKIP_UPDATE": "skip_update",
  "RETRY_STEP": "retry_step",
  "LR_CUT": "lr_cut",
  "CHECKPOINT": "checkpoint",
  "ROLLBACK": "rollback",
  "RESHARD": "reshard",
  "EXCLUDE": "exclude",
  "RESTART": "restart",
  "PAUSE": "pause",
  "CANCEL": "cancel",
  "SET": "set",
  "DECIDE": "decide",
  "REFUSED": "refused"
});
export const CheckpointTier = Object.freeze({
  "MEMORY": "memory",
  "DISK": "disk"
});
export const CommandKind = Object.freeze({
  "PAUSE": "pause",
  "RESUME": "resume",
  "CANCEL": "cancel",
  "CHECKPOINT": "checkpoint",
  "ROLLBACK": "rollback",
  "RESHARD": "reshard",
  "SET": "set",
  "DECIDE": "decide",
  "REBALANCE": "rebalance"
});
export const Header = Object.freeze({
  "TYPE": "type",
  "JOB": "job",
  "STEP": "step",
  "TIME": "time",
  "SEQ": "seq"
});
export const JobState = Object.freeze({
  "QUEUED": "queued",
  "STARTING": "starting",
  "RUNNING": "running",
  "PAUSING": "pausing",
  "PAUSED": "paused",
  "PAUSED_WARM": "paused_warm",
  "WAITING_FOR_HOSTS": "waiting_for_hosts",
  "ROLLING_BACK": "rolling_back",
  "RESHARDING": "resharding",
  "COMPLETING": "completing",
  "COMPLETED": "completed",
  "FAILED": "failed",
  "CANCELLED": "cancelled"
});
export const SpecDefaults = Object.freeze({
  "train": {
    "steps": 100,
    "micro_batch": 8,
    "grad_accum": 1,
    "seq_len": 256,
    "lr": 0.002,
    "warmup": 20,
    "decay_end": 0,
    "min_lr_ratio": 0.1,
    "weight_decay": 0.1,
    "grad_clip": 1.0,
    "seed": 0,
    "eval_every": 50,
    "eval_batches": 4,
    "trace_every": 500,
    "device": "auto",
    "threads": 0
  },
  "parallel": {
    "nodes": 1,
    "procs_per_node": 1,
    "strategy": "NNN",
    "collective": "native",
    "hosts": 1,
    "scale_up": true
  }
});
