"""Checking a delivery of agentrun's failure webhook, in the receiver."""

import hashlib
import hmac
import time


def verify(body: bytes, headers: dict, secret: str, max_age: float = 300) -> bool:
    """True when agentrun signed this body with `secret`, less than `max_age` seconds ago."""
    timestamp = headers["X-Agentrun-Timestamp"]
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    fresh = abs(time.time() - int(timestamp)) < max_age
    return fresh and hmac.compare_digest(
        "sha256=" + mac.hexdigest(), headers["X-Agentrun-Signature"]
    )
