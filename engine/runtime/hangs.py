"""What a rank's hang watchdog leaves behind: a report per hang, which rank 0 publishes (its
own at once, another rank's after the restart that the hang caused)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

from engine.anomaly import Anomaly
from engine.contract import ActionBy, ActionEvent, ActionName, AnomalyEvent, AnomalyKind, Event

EXIT_HANG = 87  # a rank's watchdog ended it; the launcher restarts the ranks


class HangReports:
    """`publisher`: whether this rank publishes the reports (rank 0, with an event log)."""

    def __init__(self, run_dir: Path, rank: int, hang_timeout_s: float,
                 emit: Callable[[Event], None], publisher: bool):
        self.folder = run_dir / "faults"
        self.rank, self.hang_timeout_s = rank, hang_timeout_s
        self.emit, self.publisher = emit, publisher

    def on_hang(self, anomaly: Anomaly) -> None:
        """The watchdog's thread: the training thread is stuck, so nothing collective can run.
        Leave a report for rank 0 to publish, then end this rank: the launcher restarts all
        of them from the newest checkpoint."""
        if anomaly.evidence.get("op_kind") == "collective":
            # Waiting in a collective, this rank is more likely the victim of a hang than its
            # cause: give the stuck rank's own watchdog time to fire first (its exit makes
            # the launcher stop every rank, this one included).
            time.sleep(self.hang_timeout_s)
        self.folder.mkdir(parents=True, exist_ok=True)
        report = self.folder / f"hang-rank{self.rank}-step{anomaly.step}.json"
        report.write_text(json.dumps({"step": anomaly.step, **anomaly.event_fields()},
                                     default=str))
        self.publish()
        os._exit(EXIT_HANG)

    def publish(self) -> None:
        """Publish every report not yet published, each with the restart it caused."""
        if not self.publisher or not self.folder.is_dir():
            return
        for report in sorted(self.folder.glob("hang-*.json")):
            fields = json.loads(report.read_text())
            step = fields.pop("step")
            self.emit(AnomalyEvent(step=step, **fields))
            self.emit(ActionEvent(step=step, action=ActionName.RESTART, anomaly=AnomalyKind.HANG,
                                  by=ActionBy.POLICY, rank=fields.get("rank"),
                                  reason="the op in flight exceeded hang_timeout_s"))
            report.rename(report.with_suffix(".published"))
