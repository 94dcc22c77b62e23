"""Users' tracker tokens, encrypted at rest (Fernet: AES-128-CBC with an HMAC) under a key
derived from the server's SECRET_KEY. Only `reveal` decrypts, for the tracker that sends the
token; nothing shows one to a person again."""

from __future__ import annotations

import base64
import hashlib

from cryptography.fernet import Fernet, InvalidToken
from django.conf import settings

from monitor.sinks.models import Secret

# keeps this key apart from anything else derived from SECRET_KEY
_PURPOSE = b"ringside monitor.sinks.secrets v1:"


def _fernet() -> Fernet:
    digest = hashlib.sha256(_PURPOSE + settings.SECRET_KEY.encode()).digest()
    return Fernet(base64.urlsafe_b64encode(digest))


def store(owner_id: int, name: str, value: str) -> Secret:
    """Keep `value` as `owner_id`'s secret `name` (replacing an earlier one), encrypted."""
    secret, _ = Secret.objects.update_or_create(
        owner_id=owner_id, name=name,
        defaults={"ciphertext": _fernet().encrypt(value.encode())})
    return secret


def reveal(owner_id: int, name: str) -> str | None:
    """The secret in clear, for the tracker that sends it; None when the user set none, or it
    was encrypted under another SECRET_KEY (the user sets it again)."""
    ciphertext = Secret.objects.filter(owner_id=owner_id, name=name).values_list(
        "ciphertext", flat=True).first()
    if ciphertext is None:
        return None
    try:
        return _fernet().decrypt(bytes(ciphertext)).decode()
    except InvalidToken:
        return None
