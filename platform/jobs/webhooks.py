"""Signed notifications: a JSON POST to each webhook of a job (its own and its owner's).

The body is signed with HMAC-SHA256 under the webhook's secret; the receiver recomputes
`sha256=<hex>` over the raw body and compares it with the `X-Ringside-Signature` header
(`verify` does exactly that). `X-Ringside-Event` names the event. Delivery is best effort with
a short timeout: a dead receiver must never stall a job's supervisor; how each delivery went is
kept on the webhook (`last_status`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import time
import urllib.error
import urllib.request
from typing import Any

from django.conf import settings

from jobs.models import Job, Webhook

log = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-Ringside-Signature"
EVENT_HEADER = "X-Ringside-Event"


def sign(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def verify(secret: str, body: bytes, signature: str) -> bool:
    return hmac.compare_digest(sign(secret, body), signature)


def payload(job: Job, event: str, data: dict[str, Any]) -> dict[str, Any]:
    return {"event": event, "time": time.time(),
            "job": {"id": job.pk, "name": job.name, "state": job.state, "step": job.step,
                    "owner": job.owner.get_username()},
            "data": data}


def deliver(hook: Webhook, event: str, body: bytes) -> str:
    """POST one signed body; returns how it went (also stored on the webhook)."""
    request = urllib.request.Request(hook.url, data=body, method="POST", headers={
        "Content-Type": "application/json", EVENT_HEADER: event,
        SIGNATURE_HEADER: sign(hook.secret, body), "User-Agent": "Ringside-Webhook/1"})
    try:
        with urllib.request.urlopen(request, timeout=settings.WEBHOOK_TIMEOUT_S) as response:
            outcome = f"{response.status} at {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}"
    except (urllib.error.URLError, OSError) as e:
        outcome = f"failed: {e}"[:200]
        log.warning("webhook %s (%s): %s", hook.pk, hook.url, outcome)
    Webhook.objects.filter(pk=hook.pk).update(last_status=outcome)
    return outcome


def notify(job: Job, event: str, data: dict[str, Any] | None = None) -> int:
    """Send `event` about `job` to each of its webhooks; returns how many were tried."""
    hooks = list(Webhook.for_job(job))
    if not hooks:
        return 0
    body = json.dumps(payload(job, event, data or {})).encode()
    for hook in hooks:
        deliver(hook, event, body)
    return len(hooks)
