// The names that cross the engine/platform seam, from engine/contract.py.
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
