"""``thinkgate serve --demo``: demo keys, created once and reused, and a snippet to paste.

The demo secrets are kept in ``demo-keys.json`` under ``THINKGATE_HOME`` (mode 0600) so that
every ``make run`` prints the same working keys. This is for a laptop demo only; real keys are
shown once and never stored (``thinkgate keys create``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from gateway.auth import keys
from gateway.auth.keystore import KeyStore
from gateway.cli.keys import open_store
from gateway.settings import Settings

_ROLES = {"client": "visible", "auditor": "hidden"}


async def prepare_demo(settings: Settings, path: Path | None = None) -> dict[str, str]:
    """Ensure a demo client key (reasoning visible) and auditor key exist; print how to use
    them. They are kept in ``path``, by default ``settings.demo_keys_file``."""
    path = path or settings.demo_keys_file
    saved = _load(path)
    async with open_store(settings) as store:
        secrets = {role: await _ensure(store, role, saved.get(role)) for role in _ROLES}
    _save(path, secrets)
    print(snippet(settings, secrets), flush=True)
    return secrets


def _load(path: Path) -> dict[str, str]:
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return saved if isinstance(saved, dict) else {}


def _save(path: Path, secrets: dict[str, str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(secrets, fh)


async def _ensure(store: KeyStore, role: str, secret: str | None) -> str:
    parts = keys.split_key(secret) if secret else None
    if parts:
        info = await store.get(parts[0])
        if info is not None and info.active and keys.verify(info, parts[1]):
            return secret  # type: ignore[return-value]
    new, _ = await store.create(
        tenant="demo",
        role=role,  # type: ignore[arg-type]
        reasoning=_ROLES[role],  # type: ignore[arg-type]
    )
    return new.secret


# The README's snippet, verbatim (a test keeps the two equal): it runs as pasted once
# THINKGATE_KEY is set, and prints the reasoning (dimmed on a terminal), then the answer.
SNIPPET = """import os
import sys

from openai import OpenAI

client = OpenAI(
    base_url=os.environ.get("THINKGATE_URL", "http://127.0.0.1:8080/v1"),
    api_key=os.environ["THINKGATE_KEY"],  # `make run` prints it
)
dim, plain = ("\\033[2m", "\\033[0m") if sys.stdout.isatty() else ("", "")
stream = client.chat.completions.create(
    model="deepseek-r1",
    stream=True,
    messages=[{"role": "user", "content": "Why is the sky blue?"}],
)
for chunk in stream:
    delta = chunk.choices[0].delta if chunk.choices else None
    if delta is None:
        continue
    reasoning = getattr(delta, "reasoning_content", None)
    if reasoning:
        print(f"{dim}{reasoning}{plain}", end="", flush=True)
    if delta.content:
        print(delta.content, end="", flush=True)
print()
"""
SNIPPET_END = "print()"


def snippet(settings: Settings, secrets: dict[str, str]) -> str:
    base = f"http://{settings.host}:{settings.port}/v1"
    return f"""
thinkgate demo: built-in simulator upstream, SQLite under {settings.home}/, in-process limiter.
  client key  (reasoning visible): {secrets["client"]}
  auditor key:                     {secrets["auditor"]}
  auditor console:                 http://{settings.host}:{settings.port}/console/ (paste the \
auditor key)

In another shell (pip install openai):

export THINKGATE_KEY={secrets["client"]}
export THINKGATE_URL={base}

then run this Python (the README's snippet):

{SNIPPET}"""
