"""The peers' own detector test cases as data: ``tests/gateway/guard/peers.json``.

Reads the parametrised cases of Presidio's recognizer tests (``presidio-analyzer/tests/``) and
detect-secrets' plugin tests (``tests/plugins/``) from a clone of each repository, by running
each test module with a ``pytest`` whose ``mark.parametrize`` records its arguments (some cases
are computed, such as Presidio's IBAN checksums), and writes them with each repository's commit:

- Presidio: per detector, each text and the values its recognizer must find (empty for a
  negative), with the test file's name. Phone cases: those at the recognizer's default
  leniency, with the regions that test's recognizer supports.
- detect-secrets: per plugin (named as ``gateway.guard.secrets`` names its rule), each line and
  whether the plugin flags it, at the tag of the release installed (``v1.5.0``): the tests of
  the rules in use, not of later changes to them.

``python -m tools.peercases PRESIDIO_CLONE DETECT_SECRETS_CLONE > tests/gateway/guard/peers.json``
(a clone: a git directory; Presidio's is read at its ``HEAD``).
"""

from __future__ import annotations

import builtins
import subprocess
import sys
import types
from collections.abc import Callable, Iterator
from importlib import metadata
from typing import Any
from unittest import mock

import orjson

PRESIDIO = {  # test file -> our detector
    "test_credit_card_recognizer.py": "credit_card",
    "test_email_recognizer.py": "email",
    "test_iban_recognizer.py": "iban",
    "test_us_ssn_recognizer.py": "us_ssn",
    "test_phone_recognizer.py": "phone",
}
PHONE_REGIONS = ["US", "GB", "DE", "FR", "IL", "IN", "CA", "BR", "JP", "CN"]  # Presidio's + JP, CN
SECRETS = {  # plugin test file -> our rule
    "artifactory_test.py": "artifactory", "aws_key_test.py": "aws",
    "azure_storage_key_test.py": "azure_storage_key", "basic_auth_test.py": "basic_auth",
    "cloudant_test.py": "cloudant", "discord_test.py": "discord",
    "github_token_test.py": "github_token", "gitlab_token_test.py": "gitlab_token",
    "ibm_cloud_iam_test.py": "ibm_cloud_iam", "ibm_cos_hmac_test.py": "ibm_cos_hmac",
    "jwt_test.py": "jwt", "mailchimp_key_test.py": "mailchimp", "npm_test.py": "npm",
    "openai_test.py": "openai", "private_key_test.py": "private_key",
    "pypi_token_test.py": "pypi_token", "sendgrid_test.py": "sendgrid", "slack_test.py": "slack",
    "softlayer_test.py": "softlayer", "square_oauth_test.py": "square_oauth",
    "stripe_key_test.py": "stripe", "telegram_token_test.py": "telegram_token",
    "twilio_test.py": "twilio",
}  # fmt: skip
_LETTERS = {ord(c): str(ord(c) - 55) for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ"}


def parametrized(source: str, name: str) -> list[tuple[list[str], list[Any]]]:
    """Every ``pytest.mark.parametrize(names, values)`` the module makes: the names and the
    values. Imports other than the standard library's are mocks (Presidio's ``IbanRecognizer``
    keeps its ``LETTERS``, which the IBAN cases' checksums use)."""
    found: list[tuple[list[str], list[Any]]] = []

    def parametrize(names: str | list[str], values: Any, **_: Any) -> Callable[[Any], Any]:
        listed = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
        found.append((listed, list(values)))
        return lambda f: f

    fake = types.SimpleNamespace(mark=mock.MagicMock(), fixture=_fixture, raises=mock.MagicMock())
    fake.mark.parametrize = parametrize
    real = builtins.__import__

    def importer(module: str, *args: Any, **kwargs: Any) -> Any:
        if module == "pytest":
            return fake
        if module.split(".")[0] in sys.stdlib_module_names:
            return real(module, *args, **kwargs)
        return _Stub(module)

    scope = {"__name__": name, "__builtins__": {**vars(builtins), "__import__": importer}}
    exec(compile(source, name, "exec"), scope)  # a peer's test module, at a pinned commit
    return found


class _Stub(types.ModuleType):
    """A module whose every name is a mock (``assert_result`` included, which a ``MagicMock``
    attribute refuses to be)."""

    def __getattr__(self, name: str) -> Any:
        made = mock.MagicMock(name=name)
        if name == "IbanRecognizer":
            made.LETTERS = _LETTERS
        return made


def _fixture(*args: Any, **_: Any) -> Any:
    return args[0] if args and callable(args[0]) else (lambda f: f)


def presidio_cases(source: str, name: str) -> Iterator[dict[str, Any]]:
    detector = PRESIDIO[name]
    for names, rows in parametrized(source, name):
        where = next((n for n in ("expected_positions", "expected_res") if n in names), None)
        if where is None or names[0] not in ("text", "iban"):
            continue
        for row in rows:
            values = dict(zip(names, row, strict=True))
            if values.get("leniency", 1) != 1:
                continue  # the recognizer's default leniency only
            text = values[names[0]]
            case = {"detector": detector, "file": name, "text": text,
                    "values": [text[start:end] for start, end in values[where]]}  # fmt: skip
            if detector == "phone":
                case["regions"] = PHONE_REGIONS
            yield case


def secrets_cases(source: str, name: str) -> Iterator[dict[str, Any]]:
    rule = SECRETS[name]
    for names, rows in parametrized(source, name):
        if len(names) != 2 or names[1] != "should_flag":
            continue
        for text, flag in rows:
            if isinstance(text, str) and isinstance(flag, bool):
                yield {"rule": rule, "file": name, "text": text, "flag": flag}


def _git(clone: str, *args: str) -> str:
    return subprocess.run(["git", "--git-dir", clone, *args], check=True, capture_output=True,
                          text=True).stdout  # fmt: skip


def collect(presidio: str, secrets: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    release = f"v{metadata.version('detect-secrets')}"
    for key, clone, ref, repo, folder, files, cases in (
        ("presidio", presidio, "HEAD", "microsoft/presidio", "presidio-analyzer/tests",
         PRESIDIO, presidio_cases),
        ("detect_secrets", secrets, release, "Yelp/detect-secrets", "tests/plugins", SECRETS,
         secrets_cases),
    ):  # fmt: skip
        commit = _git(clone, "rev-parse", f"{ref}^{{commit}}").strip()
        found: list[dict[str, Any]] = []
        for name in sorted(files):
            found += cases(_git(clone, "show", f"{commit}:{folder}/{name}"), name)
        out[key] = {"repository": repo, "ref": ref, "commit": commit, "folder": folder,
                    "cases": found}  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print(__doc__.strip().splitlines()[-2], file=sys.stderr)
        return 2
    sys.stdout.buffer.write(orjson.dumps(collect(*args), option=orjson.OPT_INDENT_2) + b"\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
