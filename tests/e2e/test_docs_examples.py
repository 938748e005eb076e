"""Every shell and Python example of the documentation runs as written: each ``sh`` and
``python`` block of ``README.md`` and ``docs/*.md`` (with the site's ``--8<--`` includes
resolved), against a live gateway with its simulator.

A shell block runs in ``bash -euo pipefail`` in a directory of its own, with the variables the
pages tell the reader to have: ``THINKGATE_KEY`` (a visible client key), ``THINKGATE_URL``,
``GW`` and ``AUDITOR_KEY``, and the ``thinkgate`` command configured for the gateway's own
database and key files, as an operator's shell on that host would be. A Python block runs in a
fresh interpreter; a fragment that uses ``client`` gets the OpenAI client the getting-started
page makes. Blocks that need what this test cannot give are run by the test named in
``ELSEWHERE`` (an interactive agent, a Docker engine, the make targets themselves), and a block
no test runs fails here by its page and line. Synopses are fenced as ``text``.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_BLOCK = re.compile(r"^```(sh|python)\n(.*?)^```", re.S | re.M)
_INCLUDE = re.compile(r'^--8<-- "(?P<file>[^":]+):(?P<section>[\w-]+)"$', re.M)

# The first line of a block → the test that runs it instead, and why.
ELSEWHERE = {
    "make run    # the gateway on 127.0.0.1:8080 (make run PORT=...) with its built-in vLLM "
    "simulator": "tests/gateway/cli/test_main.py (make run's demo; test_make_run_takes_a_port)",
    "make run    # the gateway on 127.0.0.1:8080 with its built-in vLLM simulator":
        "tests/gateway/cli/test_main.py::test_demo_serves_the_readme_snippet_and_keeps_its_keys",
    "import os": "tests/gateway/cli/test_main.py::test_demo_serves_the_readme_snippet_and_keeps"
                 "_its_keys (the snippet the demo prints, run against it)",
    'A="Authorization: Bearer $AUDITOR_KEY"':
        "tests/e2e/test_auditor_walkthrough.py (and what it leaves behind checked)",
    "export ANTHROPIC_BASE_URL=http://127.0.0.1:8080 ANTHROPIC_API_KEY=$THINKGATE_KEY":
        "tests/e2e/test_agent_clients.py::test_claude_code_answers_in_print_mode (interactive "
        "here; claude -p there)",
    "openssl ts -verify -in checkpoint.tsr -data checkpoint.body -CAfile tsa-roots.pem":
        "tests/e2e/test_evidence.py (the bundle's README runs these lines, byte for byte)",
    "thinkgate sim --port 8001 --kv-events tcp://*:5557 --kv-events-replay tcp://*:5558 \\":
        "tests/gateway/cli/test_main.py::test_sim_publishes_kv_events_as_the_routing_page_says "
        "(a server: started there on free ports, its events read)",
    "cd deploy/compose                      # compose.yaml's directory":
        "tests/deploy/test_compose.py (no Docker engine here: the compose file is checked "
        "statically)",
}  # fmt: skip


@dataclass(frozen=True)
class Example:
    page: str
    line: int
    language: str
    code: str

    @property
    def first(self) -> str:
        return self.code.splitlines()[0] if self.code else ""


def _resolve(text: str) -> str:
    """The site's ``--8<-- "file:section"`` includes, as pymdownx.snippets resolves them."""

    def include(match: re.Match[str]) -> str:
        source = (ROOT / match["file"]).read_text()
        start = source.index(f"--8<-- [start:{match['section']}]")
        body = source[
            source.index("\n", start) + 1 : source.index(f"--8<-- [end:{match['section']}]")
        ]
        return body[: body.rindex("\n") + 1] if "\n" in body else body

    return _INCLUDE.sub(include, text)


def examples() -> list[Example]:
    found = []
    for page in PAGES:
        text = _resolve(page.read_text())
        for match in _BLOCK.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            found.append(Example(str(page.relative_to(ROOT)), line, match[1], match[2]))
    return found


HERE = [e for e in examples() if e.first not in ELSEWHERE]


def test_every_example_is_run_here_or_by_a_named_test() -> None:
    firsts = {e.first for e in examples()}
    assert not set(ELSEWHERE) - firsts, "ELSEWHERE names a block no page has any more"
    for example in (e for e in examples() if e.first in ELSEWHERE):
        test_file = ELSEWHERE[example.first].split(" ")[0].split("::")[0]
        assert (ROOT / test_file).exists(), f"{example.page}:{example.line}: {test_file}"
    fences = sum(len(re.findall(r"^```(?:sh|python)$", p.read_text(), re.M)) for p in PAGES)
    includes = sum(len(_INCLUDE.findall(p.read_text())) for p in PAGES)
    assert len(examples()) == fences + includes  # the extraction finds every block


@pytest.fixture
async def reader_env(stack_factory: Any, tmp_path: Path) -> dict[str, str]:
    """The shell of a reader on the gateway's host: its URLs and keys, one request made (its
    id in ``REQUEST_ID``), and the ``thinkgate`` command on its database and key files."""
    database = tmp_path / "gw.db"
    stack = await stack_factory(database_url=f"sqlite+aiosqlite:///{database}")
    ask = {"model": "deepseek-r1", "messages": [{"role": "user", "content": "hi"}]}
    key = {"authorization": f"Bearer {stack.keys['visible']}"}
    async with httpx.AsyncClient() as client:
        answer = await client.post(f"{stack.url}/chat/completions", json=ask, headers=key)
    assert answer.status_code == 200
    venv = Path(sys.executable).parent
    return {
        **os.environ,
        "PATH": f"{venv}{os.pathsep}{os.environ.get('PATH', '')}",
        "THINKGATE_KEY": stack.keys["visible"],
        "THINKGATE_URL": stack.url,
        "GW": stack.root,
        "AUDITOR_KEY": stack.keys["auditor"],
        "REQUEST_ID": answer.headers["x-request-id"],
        "THINKGATE_DATABASE_URL": f"sqlite+aiosqlite:///{database}",
        "THINKGATE_LEDGER_KEY_FILE": str(tmp_path / "ledger-keys.json"),
        "THINKGATE_SIGNING_KEY_FILE": str(tmp_path / "signing-key.pem"),
        "THINKGATE_HOME": str(tmp_path / "home"),
    }


CLIENT = """\
import os
from openai import OpenAI
client = OpenAI(base_url=os.environ["THINKGATE_URL"], api_key=os.environ["THINKGATE_KEY"])
"""


@pytest.mark.parametrize("example", HERE, ids=[f"{e.page}:{e.line}" for e in HERE])
async def test_the_example_runs_as_written(
    example: Example, reader_env: dict[str, str], tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    if example.language == "sh":
        argv = ["bash", "-euo", "pipefail", "-c", example.code]
    else:
        uses_client = "client." in example.code and "client =" not in example.code
        prelude = CLIENT if uses_client else ""
        argv = [sys.executable, "-c", prelude + example.code]
    # the gateway runs in this event loop: the example must not block it
    process = await asyncio.create_subprocess_exec(
        *argv, cwd=work, env=reader_env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), timeout=90)
    assert process.returncode == 0, (
        f"{example.page}:{example.line} exited {process.returncode}\n{out.decode()[-2000:]}\n"
        f"{err.decode()[-2000:]}"
    )
