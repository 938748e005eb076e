"""Trusted time for checkpoints: a real RFC 3161 TSA run locally with Debian's ``openssl ts
-reply`` (its own CA and a timeStamping certificate made here), the gateway stamping its
checkpoints with it, and the stamps checked by ``openssl ts -verify``, by ``rfc3161-client``
(``audit.timestamps``) and by ``thinkgate ledger verify --tsa-roots``; a TSA that stamps
something else is not believed, and with no TSA nothing changes."""

from __future__ import annotations

import asyncio
import datetime
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from audit import timestamps
from gateway.cli.main import main
from gateway.edge.servers import BackgroundServer
from tests.e2e.conftest import Stack
from tests.e2e.test_tlog import auth
from tests.waiting import eventually

CONFIG = """[ tsa ]
default_tsa = tsa_config
[ tsa_config ]
serial = {serial}
signer_digest = sha256
default_policy = 1.2.3.4.1
digests = sha256
accuracy = secs:1
ess_cert_id_alg = sha256
"""


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _usage(**on: bool) -> x509.KeyUsage:
    names = ("digital_signature", "content_commitment", "key_encipherment", "data_encipherment",
             "key_agreement", "key_cert_sign", "crl_sign", "encipher_only",
             "decipher_only")  # fmt: skip
    return x509.KeyUsage(**{n: on.get(n, False) for n in names})


def make_pki(directory: Path, label: str) -> None:
    """A root CA and a TSA certificate it issued (critical timeStamping EKU), as PEM files."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key, tsa_key = (
        ec.generate_private_key(ec.SECP256R1()),
        ec.generate_private_key(ec.SECP256R1()),
    )
    valid = {"not_valid_before": now - datetime.timedelta(days=1),
             "not_valid_after": now + datetime.timedelta(days=30)}  # fmt: skip
    ca = (x509.CertificateBuilder(**valid).subject_name(_name(f"{label} root"))
          .issuer_name(_name(f"{label} root")).public_key(ca_key.public_key()).serial_number(1)
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(_usage(key_cert_sign=True, crl_sign=True), critical=True)
          .sign(ca_key, hashes.SHA256()))  # fmt: skip
    tsa = (x509.CertificateBuilder(**valid).subject_name(_name(f"{label} TSA"))
           .issuer_name(ca.subject).public_key(tsa_key.public_key()).serial_number(2)
           .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
           .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.TIME_STAMPING]),
                          critical=True)
           .add_extension(_usage(digital_signature=True, content_commitment=True), critical=True)
           .sign(ca_key, hashes.SHA256()))  # fmt: skip
    (directory / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (directory / "tsa.pem").write_bytes(tsa.public_bytes(serialization.Encoding.PEM))
    (directory / "tsa.key").write_bytes(tsa_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))  # fmt: skip
    (directory / "serial").write_text("01\n")
    (directory / "tsa.cnf").write_text(CONFIG.format(serial=directory / "serial"))


async def openssl(*args: str, stdin: bytes | None = None) -> tuple[int, bytes, bytes]:
    proc = await asyncio.create_subprocess_exec(
        "openssl", *args, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(stdin), timeout=30)
    assert proc.returncode is not None
    return proc.returncode, out, err


class Tsa:
    """``openssl ts -reply`` over HTTP. ``mode``: ``honest``; ``other`` stamps another message
    (a TSA that lies or a replayed reply); ``down`` answers 503."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.mode = "honest"
        self.served = 0

    async def reply(self, request: Request) -> Response:
        if self.mode == "down":
            return Response(status_code=503)
        query = await request.body()
        if self.mode == "other":
            (self.dir / "other").write_bytes(b"another message\n")
            _, query, _ = await openssl("ts", "-query", "-data", str(self.dir / "other"),
                                        "-sha256", "-cert")  # fmt: skip
        (self.dir / "q.tsq").write_bytes(query)
        code, _, err = await openssl(
            "ts", "-reply", "-config", str(self.dir / "tsa.cnf"), "-queryfile",
            str(self.dir / "q.tsq"), "-signer", str(self.dir / "tsa.pem"), "-inkey",
            str(self.dir / "tsa.key"), "-out", str(self.dir / "r.tsr"),
        )  # fmt: skip
        assert code == 0, err
        self.served += 1
        return Response((self.dir / "r.tsr").read_bytes(),
                        media_type="application/timestamp-reply")  # fmt: skip


@pytest.fixture
async def tsa(tmp_path: Path) -> AsyncIterator[tuple[Tsa, str]]:
    if shutil.which("openssl") is None:
        pytest.fail("openssl is not installed (apt-get install openssl)")
    (tmp_path / "tsa").mkdir()
    make_pki(tmp_path / "tsa", "Test")
    service = Tsa(tmp_path / "tsa")
    app = Starlette(routes=[Route("/", service.reply, methods=["POST"])])
    async with BackgroundServer(app) as server:
        yield service, f"{server.url}/"


async def complete(stack: Stack) -> None:
    async with openai.AsyncOpenAI(base_url=stack.url, api_key=stack.keys["visible"],
                                  max_retries=0) as client:  # fmt: skip
        await client.chat.completions.create(
            model="deepseek-r1", max_tokens=5, messages=[{"role": "user", "content": "hi"}]
        )


async def stamped(stack: Stack) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(base_url=stack.root) as client:
        listed = await client.get("/audit/v1/checkpoints", headers=auth(stack))
    data: list[dict[str, Any]] = listed.json()["data"]
    return [c for c in data if c["rfc3161"]]


async def test_checkpoints_get_timestamps_that_openssl_and_python_verify(
    stack_factory: Any, tsa: tuple[Tsa, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    service, url = tsa
    roots = service.dir / "ca.pem"
    stack = await stack_factory(tsa_url=url, tsa_roots_file=roots, tsa_interval_s=0.1)
    await complete(stack)
    (first, *_) = await eventually(lambda: stamped(stack))
    size, note = first["size"], first["note"]
    body = note.split("\n\n", 1)[0] + "\n"
    async with httpx.AsyncClient(base_url=stack.root) as client:
        reply = await client.get("/audit/v1/timestamp", headers=auth(stack),
                                 params={"size": size})  # fmt: skip
        none = await client.get("/audit/v1/timestamp", headers=auth(stack),
                                params={"size": 10**6})  # fmt: skip
    assert reply.headers["content-type"] == "application/timestamp-reply"
    assert none.status_code == 404 and none.json()["error"]["code"] == "no_timestamp"
    (tmp_path / "reply.tsr").write_bytes(reply.content)
    (tmp_path / "body").write_text(body)
    (tmp_path / "wrong").write_text(body.replace(f"\n{size}\n", f"\n{size + 1}\n"))
    chain = ["-CAfile", str(roots), "-untrusted", str(service.dir / "tsa.pem")]
    code, out, _ = await openssl("ts", "-verify", "-in", str(tmp_path / "reply.tsr"), "-data",
                                 str(tmp_path / "body"), *chain)  # fmt: skip
    assert code == 0 and b"Verification: OK" in out
    code, _, _ = await openssl("ts", "-verify", "-in", str(tmp_path / "reply.tsr"), "-data",
                               str(tmp_path / "wrong"), *chain)  # fmt: skip
    assert code != 0  # a stamp dates exactly its checkpoint
    when = timestamps.verify(reply.content, body, timestamps.load_roots(roots.read_bytes()))
    assert abs((datetime.datetime.now(datetime.UTC) - when).total_seconds()) < 60
    with pytest.raises(timestamps.TimestampError):
        timestamps.verify(reply.content, (tmp_path / "wrong").read_text(),
                          timestamps.load_roots(roots.read_bytes()))  # fmt: skip
    # the operator's check, against the TSA's root and against another one
    for name, value in {"DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'gw.db'}",
                        "LEDGER_KEY_FILE": str(tmp_path / "ledger-keys.json"),
                        "SIGNING_KEY_FILE": str(tmp_path / "signing-key.pem")}.items():  # fmt: skip
        monkeypatch.setenv(f"THINKGATE_{name}", value)
    assert await asyncio.to_thread(main, ["ledger", "verify", "--tsa-roots", str(roots)]) == 0
    (tmp_path / "other").mkdir()
    make_pki(tmp_path / "other", "Other")
    other = str(tmp_path / "other" / "ca.pem")
    assert await asyncio.to_thread(main, ["ledger", "verify", "--tsa-roots", other]) == 1


async def test_a_stamp_of_something_else_is_not_kept(
    stack_factory: Any, tsa: tuple[Tsa, str]
) -> None:
    service, url = tsa
    service.mode = "other"
    stack = await stack_factory(tsa_url=url, tsa_interval_s=0.1)  # no roots: the imprint check
    await complete(stack)

    async def asked_twice() -> bool:
        return service.served >= 2

    await eventually(asked_twice)
    assert await stamped(stack) == []
    service.mode = "honest"  # the TSA recovers: the next round stamps
    (found, *_) = await eventually(lambda: stamped(stack))
    assert found["size"] >= 1


async def test_without_a_tsa_nothing_changes(stack_factory: Any) -> None:
    stack = await stack_factory()
    await complete(stack)
    async with httpx.AsyncClient(base_url=stack.root) as client:
        data = (await client.get("/audit/v1/checkpoints", headers=auth(stack))).json()["data"]
    assert data and all(c["rfc3161"] is None for c in data)


async def test_with_a_tsa_and_a_witness_what_is_published_carries_both(
    stack_factory: Any, tsa: tuple[Tsa, str], tmp_path: Path
) -> None:
    from audit.witness import CosignerKey, WitnessPolicy
    from gateway.ledger.sink import ensure_keys
    from gateway.settings import Settings
    from tests.e2e.conftest import ledger_files
    from tests.e2e.test_witness import witness

    service, url = tsa
    ensure_keys(Settings(**ledger_files(tmp_path)), create=True)
    async with witness(tmp_path, "w1") as (witness_url, w1):
        stack = await stack_factory(
            tsa_url=url, tsa_roots_file=service.dir / "ca.pem", tsa_interval_s=0.1,
            witnesses=[{"url": witness_url, "key": w1.verifier_key}], witness_interval_s=0.05,
        )  # fmt: skip
        for _ in range(3):
            await complete(stack)
        policy = WitnessPolicy((CosignerKey.parse(w1.verifier_key),), 1)

        async def published() -> str | None:
            async with httpx.AsyncClient(base_url=stack.root) as client:
                answer = await client.get("/tlog/checkpoint")
            return answer.text if answer.status_code == 200 else None

        note = await eventually(published)
        policy.check(note)
        size = int(note.split("\n")[1])
        async with httpx.AsyncClient(base_url=stack.root) as client:
            reply = await client.get("/audit/v1/timestamp", headers=auth(stack),
                                     params={"size": size})  # fmt: skip
            listed = (await client.get("/audit/v1/checkpoints", headers=auth(stack))).json()
    body = note.split("\n\n", 1)[0] + "\n"
    timestamps.verify(reply.content, body, timestamps.load_roots((service.dir / "ca.pem")
                                                                 .read_bytes()))  # fmt: skip
    # the witness was only ever shown stamped checkpoints
    cosigned = [c for c in listed["data"] if w1.name in c["note"]]
    assert cosigned and all(c["rfc3161"] for c in cosigned)
