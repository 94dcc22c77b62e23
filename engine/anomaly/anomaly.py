"""The anomaly record every detector produces and the `anomaly` event carries."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

KINDS = ("nan", "loss_spike", "grad_spike", "throughput_drop", "straggler", "hang",
         "expert_collapse", "memory_growth", "crash", "sdc_suspect")
SEVERITIES = ("warning", "error", "critical")


@dataclass
class Anomaly:
    """`evidence` holds the observed values and the threshold they crossed."""

    kind: str
    severity: str
    step: int
    rank: int | None = None  # None: a global signal (the reduced loss), no single rank
    evidence: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind: unknown anomaly kind {self.kind!r}; valid: {', '.join(KINDS)}")
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity: must be one of {', '.join(SEVERITIES)}, "
                             f"got {self.severity!r}")

    def event_fields(self) -> dict[str, Any]:
        """Fields of the `anomaly` event: `AnomalyEvent(step=a.step, **a.event_fields())`."""
        fields = asdict(self)
        del fields["step"]
        return fields


def crash_anomaly(step: int, rank: int, exit_code: int, **evidence: Any) -> Anomaly:
    """What the launcher reports when rank `rank` exits with a non-zero code."""
    return Anomaly("crash", "critical", step, rank, {"exit_code": exit_code, **evidence})
