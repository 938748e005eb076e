"""RFC 3161 trusted timestamps of checkpoints (``rfc3161-client`` does the ASN.1 and the CMS
checks; this module says what is stamped and what a stamp must show).

Rules:

- What is stamped is a checkpoint's body (``origin\\nsize\\nroot\\n``, the text the log signs),
  hashed with SHA-256 in the request, with a fresh nonce and the TSA's certificate requested.
- A reply is kept only if the TSA granted it (status 0 or 1), it stamps exactly that body's
  hash and it carries the request's nonce; with trusted roots configured, its signature must
  also chain to one of them. What is stored and served is the whole TimeStampResp (DER), which
  both ``openssl ts -verify -in`` and ``rfc3161-client`` read.
- Verifying a stored stamp (``verify``) needs only the body and the roots: it returns the
  stamped time. A stamp on the checkpoint of size ``N`` dates every record below ``N``: they
  existed no later than that time.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from cryptography import x509

from audit.errors import AuditError

if TYPE_CHECKING:  # rfc3161-client is imported where a stamp is made or read: not without a TSA
    from rfc3161_client import TimeStampRequest

GRANTED = (0, 1)  # granted, grantedWithMods


class TimestampError(AuditError, ValueError):
    """A reply or stored stamp that is not a valid timestamp of this checkpoint."""


def request(body: str) -> TimeStampRequest:
    from rfc3161_client import HashAlgorithm, TimestampRequestBuilder

    return (TimestampRequestBuilder().data(body.encode()).hash_algorithm(HashAlgorithm.SHA256)
            .nonce(nonce=True).build())  # fmt: skip


def accept(reply: bytes, sent: TimeStampRequest, body: str,
           roots: Sequence[x509.Certificate] = ()) -> bytes:  # fmt: skip
    """The reply to keep for ``body``, checked as the module docstring says."""
    from rfc3161_client import decode_timestamp_response

    try:
        response = decode_timestamp_response(reply)
    except ValueError as exc:
        raise TimestampError(f"not a TimeStampResp: {exc}") from None
    if response.status not in GRANTED:
        raise TimestampError(f"the TSA refused: status {response.status} "
                             f"{' '.join(response.status_string)[:200]}")  # fmt: skip
    info = response.tst_info
    if info.message_imprint.message != hashlib.sha256(body.encode()).digest():
        raise TimestampError("the stamp is over another message")
    if info.nonce != sent.nonce:
        raise TimestampError("the stamp carries another nonce (a replay?)")
    if roots:
        verify(reply, body, roots)
    return reply


def verify(stored: bytes, body: str, roots: Sequence[x509.Certificate]) -> datetime:
    """The time ``stored`` stamps ``body`` at, its signature chaining to one of ``roots``."""
    from rfc3161_client import VerificationError, VerifierBuilder, decode_timestamp_response

    try:
        response = decode_timestamp_response(stored)
    except ValueError as exc:
        raise TimestampError(f"not a TimeStampResp: {exc}") from None
    builder = VerifierBuilder()
    for root in roots:
        builder = builder.add_root_certificate(root)
    try:
        builder.build().verify_message(response, body.encode())
    except VerificationError as exc:
        raise TimestampError(f"the timestamp does not verify: {exc}") from None
    return response.tst_info.gen_time


def load_roots(pem: bytes) -> list[x509.Certificate]:
    try:
        return x509.load_pem_x509_certificates(pem)
    except ValueError as exc:
        raise TimestampError(f"not PEM certificates: {exc}") from None
