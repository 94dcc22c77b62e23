"""The names the API and the token views steer and audit with; the command lifecycle lives in
jobs.commands, the audit trail on `AuditEntry`."""

from jobs.commands import deliver_pending, issue
from jobs.models import AuditEntry

audit = AuditEntry.record

__all__ = ["audit", "deliver_pending", "issue"]
