"""Tenants' prefix caches kept apart: the ``cache_salt`` the gateway gives a request (sans-I/O).

A shared prefix cache is a timing side channel: a tenant whose request comes back fast has
learnt that another tenant sent the same prefix. vLLM keys a prompt's first block on the
request's ``cache_salt``, so requests with different salts never share a block. With
``PREFIX_CACHE_SHARING=tenant`` (the default) every request gets
``HMAC-SHA256(PREFIX_CACHE_SECRET, tenant || client salt)``: a client's own ``cache_salt`` is
combined with its tenant's, never replaces it, so no client can choose a salt that lands in
another tenant's cache. The secret keeps someone with direct access to an engine from
computing a tenant's salt; without it the salt is still per tenant and out of clients' reach.
With ``global`` the client's salt, if any, is passed on as it is.
"""

from __future__ import annotations

import hashlib
import hmac

import orjson

_LABEL = b"thinkgate/cache-salt/v1\0"


def cache_salt(sharing: str, secret: bytes, tenant: str, client: str | None) -> str | None:
    if sharing == "global":
        return client
    message = _LABEL + tenant.encode() + b"\0" + (client or "").encode()
    return hmac.new(secret or _LABEL, message, hashlib.sha256).hexdigest()


def client_salt(body: bytes) -> str | None:
    """The ``cache_salt`` a request body names, if any (parsed only when it names one)."""
    if b'"cache_salt"' not in body:
        return None
    found = orjson.loads(body).get("cache_salt")
    return found if isinstance(found, str) and found else None


def salted(body: bytes, salt: str | None) -> bytes:
    """The upstream JSON object ``body`` with its ``cache_salt`` set to ``salt`` (``None``:
    removed). A body without one (the usual case) gets it spliced in before its closing brace,
    without a parse: the gateway's parsers wrote it with orjson."""
    if b'"cache_salt"' in body:
        request = orjson.loads(body)
        request.pop("cache_salt", None)
        if salt is not None:
            request["cache_salt"] = salt
        return orjson.dumps(request)
    if salt is None:
        return body
    tail = orjson.dumps(salt)
    if body.endswith(b"{}"):
        return b'{"cache_salt":' + tail + b"}"
    return body[:-1] + b',"cache_salt":' + tail + b"}"
