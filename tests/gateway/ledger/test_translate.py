"""The one boundary from the audit package's errors to the gateway's: complete, and safe."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import audit
from audit.crypto import DecryptionError
from audit.errors import AuditError
from audit.ledger import ProofUnavailable
from audit.writer import WriterUnavailable
from gateway.errors import InvalidRequest, LedgerIntegrityError, LedgerUnavailable
from gateway.ledger.translate import TRANSLATIONS, translate


def audit_errors() -> set[type[AuditError]]:
    for info in pkgutil.walk_packages(audit.__path__, "audit."):
        importlib.import_module(info.name)
    found: set[type[AuditError]] = set()
    todo = [AuditError]
    while todo:
        for sub in todo.pop().__subclasses__():
            found.add(sub)
            todo.append(sub)
    return found


def test_every_audit_error_has_its_translation() -> None:
    errors = audit_errors()
    assert len(errors) >= 11
    assert errors <= set(TRANSLATIONS), errors - set(TRANSLATIONS)


def test_every_exception_the_audit_package_defines_is_an_audit_error() -> None:
    for info in pkgutil.walk_packages(audit.__path__, "audit."):
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and issubclass(value, Exception)
                and value.__module__ == module.__name__
            ):
                assert issubclass(value, AuditError), f"{module.__name__}.{value.__name__}"


@pytest.mark.parametrize(
    ("error", "expected", "status"),
    [
        (WriterUnavailable("disk full at /var/secret"), LedgerUnavailable, 503),
        (DecryptionError(), LedgerIntegrityError, 500),
        (ProofUnavailable("the ledger has 3 records, fewer than 9"), InvalidRequest, 400),
    ],
)
def test_translations_keep_the_status_and_say_only_what_is_safe(
    error: AuditError, expected: type, status: int
) -> None:
    out = translate(error, param="tree_size")
    assert isinstance(out, expected) and out.status == status
    if isinstance(out, InvalidRequest):
        assert "fewer than 9" in out.message and out.param == "tree_size"
    elif isinstance(error, WriterUnavailable):
        assert "/var/secret" not in out.message  # nothing from inside the ledger leaks out
