"""The anomaly record every detector produces and the `anomaly` event carries."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from engine.contract import AnomalyKind

# the kinds the detectors find and the fault ladder answers, in the order it decides them; the
# others (a lost host, a corrupt checkpoint) are reported by the platform and the loader only
REPORTED_ONLY = frozenset({AnomalyKind.HOST_LOST, AnomalyKind.CHECKPOINT_CORRUPT})
KINDS = tuple(kind for kind in AnomalyKind if kind not in REPORTED_ONLY)
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
    return Anomaly(AnomalyKind.CRASH, "critical", step, rank, {"exit_code": exit_code, **evidence})
