"""Signed notifications: a JSON POST to each webhook of a job (its own and its owner's).

The body is signed with HMAC-SHA256 under the webhook's secret; the receiver recomputes
`sha256=<hex>` over the raw body and compares it with the `X-Ringside-Signature` header
(`verify` does exactly that). `X-Ringside-Event` names the event.

`notify` only queues one `deliver` task per webhook: a slow or dead receiver never stalls a
job's supervisor. Each attempt checks the URL again (common.addresses: its host resolved now,
every address public or in the operator's allow-list) and connects to an address it checked,
with the URL's name in the Host header and for TLS; redirects are not followed. An unreachable
receiver, or one answering 5xx or 429, gets up to WEBHOOK_ATTEMPTS attempts with exponential
backoff. `last_status` says how the last attempt went, in words that tell nothing about the
network behind the URL: DELIVERED, `refused_by_receiver(code)`, UNREACHABLE or NOT_PUBLIC.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import time
from typing import Any

import httpx
from celery import shared_task
from django.conf import settings
from kombu.exceptions import OperationalError

from common import addresses
from jobs.models import Job, Webhook

log = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-Ringside-Signature"
EVENT_HEADER = "X-Ringside-Event"
DELIVERED = "delivered"
UNREACHABLE = "unreachable"
NOT_PUBLIC = f"refused: {addresses.NOT_PUBLIC}"
# answers worth another attempt: the receiver's trouble, not a refusal of the request
RETRIED_STATUSES = {408, 429}


def refused_by_receiver(code: int) -> str:
    return f"refused by the receiver (HTTP {code})"


def sign(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def verify(secret: str, body: bytes, signature: str) -> bool:
    return hmac.compare_digest(sign(secret, body), signature)


def payload(job: Job, event: str, data: dict[str, Any]) -> dict[str, Any]:
    return {"event": event, "time": time.time(),
            "job": {"id": job.pk, "name": job.name, "state": job.state, "step": job.step,
                    "owner": job.owner.get_username()},
            "data": data}


def notify(job: Job, event: str, data: dict[str, Any] | None = None) -> int:
    """Queue `event` about `job` for each of its webhooks; returns how many were queued."""
    hooks = list(Webhook.for_job(job).values_list("pk", flat=True))
    if not hooks:
        return 0
    body = json.dumps(payload(job, event, data or {}))
    for queued, hook_id in enumerate(hooks):
        try:
            deliver.delay(hook_id, event, body)
        except OperationalError as e:
            # the broker is down: notifications are best effort, and each further try would
            # hold the supervisor as long again
            log.warning("job %s: %s not queued for %d webhooks (%s)", job.pk, event,
                        len(hooks) - queued, e)
            return queued
    return len(hooks)


@shared_task(bind=True, name="jobs.webhooks.deliver")
def deliver(self, hook_id: int, event: str, body: str) -> str:
    """One attempt at POSTing the signed `body` to webhook `hook_id`, retried with backoff
    while another may go better; returns how it went (also kept as the hook's last_status)."""
    hook = Webhook.objects.filter(pk=hook_id).first()
    if hook is None:
        return "gone"  # deleted since the event
    outcome, again = attempt(hook, event, body.encode())
    Webhook.objects.filter(pk=hook_id).update(last_status=outcome)
    if again and self.request.retries + 1 < settings.WEBHOOK_ATTEMPTS:
        raise self.retry(countdown=settings.WEBHOOK_RETRY_S * 2 ** self.request.retries,
                         max_retries=settings.WEBHOOK_ATTEMPTS - 1)
    return outcome


def attempt(hook: Webhook, event: str, body: bytes) -> tuple[str, bool]:
    """POST once to an address of the hook's URL checked just now; (how it went, whether
    another attempt may go better)."""
    try:
        target = addresses.reachable(hook.url)
    except addresses.Unresolved:
        return UNREACHABLE, True
    except addresses.Refused:
        log.warning("webhook %s: %s is not a public address now; not sent", hook.pk, hook.url)
        return NOT_PUBLIC, False
    headers = {"Content-Type": "application/json", EVENT_HEADER: event,
               SIGNATURE_HEADER: sign(hook.secret, body), "User-Agent": "Ringside-Webhook/1",
               "Host": target.host_header}
    # trust_env off: no proxy from the environment stands between us and the checked address
    with httpx.Client(timeout=settings.WEBHOOK_TIMEOUT_S, follow_redirects=False,
                      trust_env=False) as client:
        for address in target.addresses:
            try:
                code = _post(client, target, address, headers, body)
            except httpx.ConnectError as e:  # nothing sent: the next address may answer
                log.warning("webhook %s: %s: %s", hook.pk, address, e)
                continue
            except httpx.HTTPError as e:
                log.warning("webhook %s: %s: %s", hook.pk, address, e)
                return UNREACHABLE, True
            if 200 <= code < 300:
                return DELIVERED, False
            return refused_by_receiver(code), code >= 500 or code in RETRIED_STATUSES
    return UNREACHABLE, True


def _post(client: httpx.Client, target: addresses.Target, address: addresses.Address,
          headers: dict[str, str], body: bytes) -> int:
    """The status of one POST to `address`; the answer's body is never read."""
    extensions = {"sni_hostname": target.server_name} if target.server_name else {}
    with client.stream("POST", target.url_for(address), content=body, headers=headers,
                       extensions=extensions) as response:
        return response.status_code
