"""The agent clients people point at a self-hosted reasoning model, each configured only as its
own docs say for a custom endpoint, against the gateway ``make run`` serves (the simulator as
the engine, ``gateway.app.DEMO_MODELS``): openai-node's ``responses.stream()``, the AI SDK
(Responses with its defaults, ``openai.chat``, ``@ai-sdk/anthropic``), the Anthropic TypeScript
SDK, Claude Code (``claude -p``), Codex CLI (``codex exec``), LangChain and pydantic-ai on
Responses. Each test asserts on what the client got; when it fails, its message carries the
client's stderr and every request the gateway refused, whole (``tests/e2e/agent_clients.py``).

The node clients are pinned in ``tests/clients/package-lock.json``; all tests of this file run
on one xdist worker, so the CLIs (each a few hundred MB) never start side by side.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from gateway.app import DEMO_MODELS, create_app
from gateway.edge.servers import BackgroundServer
from gateway.ledger.sink import ensure_keys
from gateway.settings import Settings
from gateway.side.sim.app import SimConfig, create_sim_app
from tests.e2e.agent_clients import (
    CLIENTS,
    NODE_BIN,
    Outcome,
    Tap,
    clean_env,
    redact,
    require_clients,
    run_client,
)
from tests.e2e.conftest import Stack, ledger_files, make_keys

pytestmark = [pytest.mark.xdist_group("agent_clients"), pytest.mark.timeout(150)]

MODEL = "deepseek-r1"  # the demo's first model: R1's template, reasoning in the text
QUESTION = "Why is the sky blue?"
NODE_TIMEOUT_S = 30
CLI_TIMEOUT_S = 90


@dataclass(repr=False)
class Gateway:
    """The gateway under test, its tap, and a directory for the clients' homes."""

    stack: Stack
    tap: Tap
    home: Path

    def __repr__(self) -> str:  # pytest prints fixtures in tracebacks: never the keys
        return f"Gateway({self.stack.root})"

    @property
    def secrets(self) -> list[str]:
        return list(self.stack.keys.values())

    def explain(self, outcome: Outcome) -> str:
        return outcome.explain(self.tap, self.secrets)

    def report(self, what: Any) -> str:
        """A failure message for a result that came back wrong: it and the gateway's story."""
        return redact(f"client got: {what!r}\n{self.tap.report(last=True)}", self.secrets)

    async def node(self, script: str, *args: str, key: str = "visible") -> Any:
        """Runs ``tests/clients/<script>`` and returns the JSON it printed last."""
        env = clean_env(self.home / "node", {
            "GATEWAY_URL": self.stack.url, "GATEWAY_ROOT": self.stack.root,
            "GATEWAY_KEY": self.stack.keys[key], "GATEWAY_MODEL": MODEL,
        })  # fmt: skip
        outcome = await run_client(
            ["node", str(CLIENTS / script), *args], env, CLIENTS, NODE_TIMEOUT_S
        )
        assert outcome.returncode == 0, self.explain(outcome)
        return outcome.result()


@pytest.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[Gateway]:
    """The simulator with no delays, and the gateway in front of it configured as ``thinkgate
    serve --demo`` configures it (the demo's models), behind a tap."""
    require_clients()
    async with AsyncExitStack() as exits:
        sim = await exits.enter_async_context(BackgroundServer(create_sim_app(SimConfig())))
        options: dict[str, Any] = {
            "upstreams": (f"{sim.url}/v1",),
            "database_url": f"sqlite+aiosqlite:///{tmp_path / 'gw.db'}",
            "models_cache_ttl_s": 0,
            **ledger_files(tmp_path),
        }
        settings = Settings(**options).with_default_models(DEMO_MODELS)
        ensure_keys(settings.ledger, create=True)
        keys = await make_keys(settings)
        tap = Tap(create_app(settings))
        server = await exits.enter_async_context(BackgroundServer(tap))
        stack = Stack(url=f"{server.url}/v1", root=server.url, sim=None, keys=keys)
        yield Gateway(stack, tap, tmp_path / "clients")


SDK_ADDED = frozenset({"parsed", "output_parsed", "output_text"})


def without_parsed(value: Any) -> Any:
    """A response as the server sent it: the SDK adds ``parsed``, ``output_parsed`` and
    ``output_text`` to what it accumulates."""
    if isinstance(value, dict):
        return {k: without_parsed(v) for k, v in value.items() if k not in SDK_ADDED}
    if isinstance(value, list):
        return [without_parsed(v) for v in value]
    return value


# --- openai-node


async def test_openai_node_responses_stream_accumulates_what_the_server_completed(
    gateway: Gateway,
) -> None:
    got = await gateway.node("openai_responses_stream.mjs")
    final, completed = got["final"], got["completed"]
    assert got["outputText"], gateway.report(got)
    assert got["deltas"] == got["lastSnapshot"] == got["outputText"], gateway.report(got)
    assert completed is not None and got["kinds"][-1] == "response.completed", gateway.report(got)
    assert without_parsed(final) == without_parsed(completed), gateway.report(got)


# --- the AI SDK


async def test_ai_sdk_responses_answers_a_second_turn_that_references_stored_items(
    gateway: Gateway,
) -> None:
    got = await gateway.node("ai_sdk_responses.mjs", "two-turns")
    assert got["first"]["text"] and got["second"]["text"], gateway.report(got)
    second = gateway.tap.requests("/v1/responses")[-1]
    kinds = [item.get("type") for item in second["input"]]
    assert "item_reference" in kinds, f"the SDK sent no reference this time: {kinds}"


async def test_ai_sdk_responses_tool_loop_answers_after_calling_the_tool(
    gateway: Gateway,
) -> None:
    got = await gateway.node("ai_sdk_responses.mjs", "tool-loop")
    assert got["calls"], gateway.report(got)  # the tool ran
    assert got["steps"][0]["finishReason"] == "tool-calls", gateway.report(got)
    assert got["steps"][-1]["finishReason"] == "stop", gateway.report(got)
    assert got["text"], gateway.report(got)


@pytest.mark.parametrize("key", ["visible", "hidden"])
async def test_ai_sdk_responses_reasoning_summary_only_for_a_visible_key(
    gateway: Gateway, key: str
) -> None:
    got = await gateway.node("ai_sdk_responses.mjs", "one-turn", key=key)
    assert got["text"], gateway.report(got)
    if key == "visible":
        assert got["reasoningText"], gateway.report(got)
    else:
        assert got["reasoningText"] == "", gateway.report(got)


@pytest.mark.parametrize("provider", ["openai-chat", "openai-compatible", "anthropic"])
async def test_ai_sdk_generates_and_streams_text(gateway: Gateway, provider: str) -> None:
    got = await gateway.node("ai_sdk_text.mjs", provider)
    generated, streamed = got["generated"], got["streamed"]
    assert generated["text"] and generated["finishReason"] == "stop", gateway.report(got)
    assert streamed["errors"] == [], gateway.report(got)
    assert streamed["text"] and streamed["finishReason"] == "stop", gateway.report(got)
    assert streamed["text"] == generated["text"], gateway.report(got)  # the simulator's answer


# --- the Anthropic TypeScript SDK


async def test_anthropic_node_messages_stream_with_thinking(gateway: Gateway) -> None:
    got = await gateway.node("anthropic_messages_stream.mjs")
    blocks = got["final"]["content"]
    assert [b["type"] for b in blocks] == ["thinking", "text"], gateway.report(got)
    assert blocks[0]["thinking"] and blocks[1]["text"] == got["text"] != "", gateway.report(got)


# --- Claude Code


@pytest.mark.parametrize("thinking", [True, False], ids=["thinking-on", "thinking-off"])
async def test_claude_code_answers_in_print_mode(gateway: Gateway, thinking: bool) -> None:
    """``claude -p`` with its default tools, pointed at the gateway by ``ANTHROPIC_BASE_URL``;
    thinking on (``MAX_THINKING_TOKENS`` > 0: Claude Code 2.1 then sends ``thinking: {type:
    "adaptive"}`` and ``context_management``), off (0: no ``thinking``)."""
    home = gateway.home / "claude"
    project = home / "project"
    project.mkdir(parents=True)
    env = clean_env(home, {
        "ANTHROPIC_BASE_URL": gateway.stack.root,
        "ANTHROPIC_API_KEY": gateway.stack.keys["visible"],
        "CLAUDE_CONFIG_DIR": str(home / ".claude"),
        "DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1", "DISABLE_ERROR_REPORTING": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "MAX_THINKING_TOKENS": "4096" if thinking else "0",
    })  # fmt: skip
    argv = [str(NODE_BIN / "claude"), "-p", QUESTION, "--output-format", "json",
            "--model", MODEL]  # fmt: skip
    outcome = await run_client(argv, env, project, CLI_TIMEOUT_S)
    assert outcome.returncode == 0, gateway.explain(outcome)
    result = outcome.result()
    assert result["is_error"] is False and result["result"], gateway.explain(outcome)


# --- Codex CLI


CODEX_CONFIG = """\
model = "{model}"
model_provider = "thinkgate"
model_reasoning_summary = "auto"
check_for_update_on_startup = false

[model_providers.thinkgate]
name = "thinkgate"
base_url = "{url}"
env_key = "THINKGATE_KEY"
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0

[features]
plugins = false

[analytics]
enabled = false

[feedback]
enabled = false
"""


async def run_codex(gateway: Gateway) -> tuple[Outcome, list[dict[str, Any]]]:
    """``codex exec --json`` with its default tools, a read-only sandbox and a model provider
    of the gateway's in ``$CODEX_HOME/config.toml``, reasoning summaries asked for; the run
    and the items it completed."""
    home = gateway.home / "codex"
    project, codex_home = home / "project", home / ".codex"
    project.mkdir(parents=True)
    codex_home.mkdir()
    config = CODEX_CONFIG.format(model=MODEL, url=gateway.stack.url)
    (codex_home / "config.toml").write_text(config)
    env = clean_env(home, {
        "CODEX_HOME": str(codex_home), "THINKGATE_KEY": gateway.stack.keys["visible"],
    })  # fmt: skip
    argv = [str(NODE_BIN / "codex"), "exec", "--skip-git-repo-check", "--sandbox", "read-only",
            "--json", QUESTION]  # fmt: skip
    outcome = await run_client(argv, env, project, CLI_TIMEOUT_S)
    assert outcome.returncode == 0, gateway.explain(outcome)
    events = [json.loads(line) for line in outcome.stdout.splitlines() if line.startswith("{")]
    items = [e["item"] for e in events if e.get("type") == "item.completed"]
    return outcome, items


async def test_codex_exec_answers_with_a_custom_responses_provider(gateway: Gateway) -> None:
    outcome, items = await run_codex(gateway)
    answers = [item["text"] for item in items if item.get("type") == "agent_message"]
    assert answers and answers[-1], gateway.explain(outcome)


async def test_codex_exec_shows_the_reasoning_summary(gateway: Gateway) -> None:
    """``model_reasoning_summary = "auto"`` on a key that may see reasoning: Codex prints the
    summary it received as a ``reasoning`` item."""
    outcome, items = await run_codex(gateway)
    reasoning = [item.get("text", "") for item in items if item.get("type") == "reasoning"]
    assert "".join(reasoning), gateway.explain(outcome)


# --- Python clients


@pytest.mark.parametrize("route", ["openai", "anthropic"])
async def test_litellm_completes_and_streams(gateway: Gateway, route: str) -> None:
    """LiteLLM's providers pointed at the gateway as its docs say for a custom endpoint:
    ``openai/<model>`` with ``api_base`` (Chat Completions), ``anthropic/<model>`` (Messages)."""
    import litellm  # imported here, as langchain_openai below

    base = gateway.stack.url if route == "openai" else gateway.stack.root
    common: dict[str, Any] = {
        "model": f"{route}/{MODEL}", "api_base": base, "api_key": gateway.stack.keys["visible"],
        "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 2000,
        "num_retries": 0,
    }  # fmt: skip
    whole = await litellm.acompletion(**common)
    assert whole.choices[0].message.content, gateway.report(whole)
    stream = await litellm.acompletion(**common, stream=True)
    text = "".join([chunk.choices[0].delta.content or "" async for chunk in stream])
    assert text == whole.choices[0].message.content, gateway.report(text)


# --- Python clients on Responses


@pytest.mark.parametrize("key", ["visible", "hidden"])
async def test_langchain_responses_reasoning_only_for_a_visible_key(
    gateway: Gateway, key: str
) -> None:
    # imported here: a missing dev extra fails these tests alone, not the file's collection
    from langchain_openai import ChatOpenAI

    async with httpx.AsyncClient() as http:
        model = ChatOpenAI(
            model=MODEL, base_url=gateway.stack.url, api_key=gateway.stack.keys[key],
            use_responses_api=True, reasoning={"effort": "low", "summary": "auto"},
            max_retries=0, http_async_client=http,
        )  # fmt: skip
        message = await model.ainvoke(QUESTION)
    reasoning = [b.get("reasoning", "") for b in message.content_blocks if b["type"] == "reasoning"]
    assert message.text, gateway.report(message)
    if key == "visible":
        assert "".join(reasoning), gateway.report(message)
    else:
        assert "".join(reasoning) == "", gateway.report(message)


@pytest.mark.parametrize("key", ["visible", "hidden"])
async def test_pydantic_ai_responses_reasoning_only_for_a_visible_key(
    gateway: Gateway, key: str
) -> None:
    from pydantic_ai import Agent  # imported here, as langchain_openai above
    from pydantic_ai.messages import ModelResponse, ThinkingPart
    from pydantic_ai.models.openai import OpenAIResponsesModel, OpenAIResponsesModelSettings
    from pydantic_ai.providers.openai import OpenAIProvider

    settings = OpenAIResponsesModelSettings(openai_reasoning_summary="auto")
    async with openai.AsyncOpenAI(base_url=gateway.stack.url, api_key=gateway.stack.keys[key],
                                  max_retries=0) as client:  # fmt: skip
        model = OpenAIResponsesModel(MODEL, provider=OpenAIProvider(openai_client=client))
        result = await Agent(model, model_settings=settings).run(QUESTION)
    thinking = [
        part.content
        for message in result.all_messages()
        if isinstance(message, ModelResponse)
        for part in message.parts
        if isinstance(part, ThinkingPart)
    ]
    assert result.output, gateway.report(result.all_messages())
    if key == "visible":
        assert "".join(thinking), gateway.report(result.all_messages())
    else:
        assert "".join(thinking) == "", gateway.report(result.all_messages())
