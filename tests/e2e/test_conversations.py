"""The Conversations API (``/v1/conversations``) through real clients against the real stack:
the ``openai`` SDK (create with items, pages both ways with ``limit``/``after``/``has_more``,
add, retrieve and delete an item, update the metadata, delete), another tenant's key and a
hidden key; the OpenAI Agents SDK keeping a two-turn session in a conversation
(``OpenAIConversationsSession``), whose second turn gives the engine the first one; and
openai-node (``tests/clients/openai_conversations.mjs``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from agents import Agent, OpenAIResponsesModel, RunConfig, Runner, set_tracing_disabled
from agents.memory import OpenAIConversationsSession

from gateway.side.sim.app import SimApp
from tests.e2e.agent_clients import CLIENTS, clean_env, run_client
from tests.e2e.conftest import Stack
from tests.e2e.test_responses import sdk

MODEL = "deepseek-r1"
QUESTION: list[Any] = [
    {"role": "user", "content": "Why is the sky blue?"},
    {"type": "message", "role": "assistant", "content": "Rayleigh scattering."},
    {"role": "user", "content": [{"type": "input_text", "text": "And the sea?"}]},
]
TRACE = "the hidden trace of thought"
REASONING: dict[str, Any] = {
    "type": "reasoning",
    "summary": [{"type": "summary_text", "text": TRACE}],
    "content": [{"type": "reasoning_text", "text": TRACE}],
}


def dumped(items: list[Any]) -> list[dict[str, Any]]:
    return [item.model_dump(exclude_unset=True) for item in items]


async def every(client: openai.AsyncOpenAI, conversation_id: str, **query: Any) -> list[Any]:
    """Every item, through the SDK's own pagination."""
    return [item async for item in client.conversations.items.list(conversation_id, **query)]


async def test_a_conversation_through_the_sdk(stack: Stack) -> None:
    async with sdk(stack, "visible") as client:
        made = await client.conversations.create(items=QUESTION, metadata={"topic": "sky"})
        assert made.object == "conversation" and made.id.startswith("conv_")
        assert made.metadata == {"topic": "sky"} and isinstance(made.created_at, int)
        assert (await client.conversations.retrieve(made.id)).model_dump() == made.model_dump()

        newest = await client.conversations.items.list(made.id)  # desc, 20, by default
        first, answer, second = dumped(newest.data[::-1])
        assert first == {"type": "message", "id": first["id"], "status": "completed",
                         "role": "user", "content": [{"type": "input_text",
                                                      "text": "Why is the sky blue?"}]}  # fmt: skip
        assert first["id"].startswith("msg_") and len({first["id"], answer["id"],
                                                       second["id"]}) == 3  # fmt: skip
        assert answer["content"] == [{"type": "output_text", "text": "Rayleigh scattering."}]
        assert second["content"] == [{"type": "input_text", "text": "And the sea?"}]
        assert (newest.first_id, newest.last_id, newest.has_more) == (second["id"], first["id"],
                                                                      False)  # fmt: skip

        call = {"type": "function_call", "call_id": "call_1", "name": "get_weather",
                "arguments": '{"city":"Paris"}'}  # fmt: skip
        mine = {"type": "message", "id": "msg_from_the_client", "role": "user", "content": "Hi"}
        added = await client.conversations.items.create(made.id, items=[call, mine])
        fc, msg = dumped(added.data)
        assert fc["id"].startswith("fc_") and fc["status"] == "completed"
        assert fc["call_id"] == "call_1" and msg["id"] == "msg_from_the_client"
        assert (added.first_id, added.last_id, added.has_more) == (fc["id"], msg["id"], False)
        order = [first["id"], answer["id"], second["id"], fc["id"], msg["id"]]

        page = await client.conversations.items.list(made.id, order="asc", limit=2)
        assert [i.id for i in page.data] == order[:2] and page.has_more
        assert page.last_id == order[1]
        page = await client.conversations.items.list(made.id, order="asc", limit=2,
                                                     after=order[1])  # fmt: skip
        assert [i.id for i in page.data] == order[2:4] and page.has_more
        page = await client.conversations.items.list(made.id, limit=2, after=order[1])
        assert [i.id for i in page.data] == [order[0]] and not page.has_more
        assert [i.id for i in await every(client, made.id, order="asc", limit=2)] == order
        assert [i.id for i in await every(client, made.id, limit=3)] == order[::-1]
        included = await every(client, made.id, include=["message.output_text.logprobs"])
        assert [i.id for i in included] == order[::-1]  # accepted, without effect

        got = await client.conversations.items.retrieve(fc["id"], conversation_id=made.id)
        assert got.model_dump(exclude_unset=True) == fc
        after_delete = await client.conversations.items.delete(fc["id"], conversation_id=made.id)
        assert after_delete.model_dump() == made.model_dump()
        assert [i.id for i in await every(client, made.id, order="asc")] == order[:3] + order[4:]
        with pytest.raises(openai.NotFoundError):
            await client.conversations.items.retrieve(fc["id"], conversation_id=made.id)

        updated = await client.conversations.update(made.id, metadata={"topic": "sea", "n": "2"})
        assert updated.metadata == {"topic": "sea", "n": "2"} and updated.id == made.id
        assert (await client.conversations.retrieve(made.id)).metadata == updated.metadata

        deleted = await client.conversations.delete(made.id)
        assert deleted.model_dump() == {"id": made.id, "object": "conversation.deleted",
                                        "deleted": True}  # fmt: skip
        for gone in (lambda: client.conversations.retrieve(made.id),
                     lambda: every(client, made.id),
                     lambda: client.conversations.delete(made.id),
                     lambda: client.conversations.items.create(made.id, items=[mine])):  # fmt: skip
            assert await not_found(gone()) == {
                "message": f"Conversation with id '{made.id}' not found.",
                "type": "not_found_error", "param": None, "code": "not_found"}  # fmt: skip


async def not_found(attempt: Any) -> dict[str, Any]:
    with pytest.raises(openai.NotFoundError) as raised:
        await attempt
    body: dict[str, Any] = raised.value.body
    return body


async def test_another_tenants_conversation_is_a_404_like_an_unknown_one(stack: Stack) -> None:
    async with sdk(stack, "visible") as owner, sdk(stack, "other") as other:
        made = await owner.conversations.create(items=QUESTION[:1], metadata={"k": "v"})
        (item,) = await every(owner, made.id)
        unknown = "conv_" + "0" * 48
        for cid in (made.id, unknown):
            answers = [
                await not_found(other.conversations.retrieve(cid)),
                await not_found(other.conversations.update(cid, metadata={"k": "w"})),
                await not_found(other.conversations.items.list(cid)),
                await not_found(other.conversations.items.create(cid, items=QUESTION[:1])),
                await not_found(other.conversations.items.retrieve(item.id, conversation_id=cid)),
                await not_found(other.conversations.items.delete(item.id, conversation_id=cid)),
                await not_found(other.conversations.delete(cid)),
            ]
            assert all(a == {"message": f"Conversation with id '{cid}' not found.",
                             "type": "not_found_error", "param": None,
                             "code": "not_found"} for a in answers), answers  # fmt: skip
        kept = await owner.conversations.retrieve(made.id)
        assert kept.metadata == {"k": "v"}
        assert [i.id for i in await every(owner, made.id)] == [item.id]


async def test_a_hidden_key_never_reads_reasoning_text_back(stack: Stack) -> None:
    reasoning = {**REASONING, "encrypted_content": "tgr1-opaque"}
    async with sdk(stack, "visible") as client:
        made = await client.conversations.create(items=[QUESTION[0], reasoning, QUESTION[1]])
        visible = dumped(await every(client, made.id, order="asc"))
    assert visible[1]["content"] == REASONING["content"] and visible[1]["id"].startswith("rs_")
    rs = visible[1]["id"]
    headers = {"authorization": f"Bearer {stack.keys['hidden']}"}
    async with httpx.AsyncClient(base_url=stack.url, headers=headers) as http:
        listed = await http.get(f"/conversations/{made.id}/items", params={"order": "asc"})
        one = await http.get(f"/conversations/{made.id}/items/{rs}")
        added = await http.post(f"/conversations/{made.id}/items",
                                json={"items": [{**reasoning, "id": "rs_mine"}]})  # fmt: skip
        again = await http.get(f"/conversations/{made.id}/items", params={"order": "asc"})
    for answer in (listed, one, added, again):
        assert answer.status_code == 200, answer.text
        assert TRACE.encode() not in answer.content and b"reasoning_text" not in answer.content
    hidden = listed.json()["data"]
    assert [i["id"] for i in hidden] == [i["id"] for i in visible]
    assert hidden[1] == {"type": "reasoning", "id": rs, "summary": [],
                         "encrypted_content": "tgr1-opaque"}  # fmt: skip
    assert one.json() == hidden[1] and hidden[0] == visible[0]
    async with sdk(stack, "visible") as client:  # the text was kept: the visible key reads it
        last = await client.conversations.items.retrieve("rs_mine", conversation_id=made.id)
        assert last.model_dump(exclude_unset=True)["content"] == REASONING["content"]


async def test_what_the_gateway_refuses(stack: Stack) -> None:
    async with sdk(stack, "visible") as client:
        made = await client.conversations.create(items=QUESTION[:1])
        (item,) = await every(client, made.id)
        add, items = client.conversations.items.create, client.conversations.items.list
        user, twice = QUESTION[0], {**QUESTION[0], "id": "msg_x"}
        refused = {
            "items[0].id": lambda: add(made.id, items=[{**user, "id": item.id}]),
            "items[1].id": lambda: add(made.id, items=[user, twice, twice]),
            "items[1].type": lambda: add(made.id, items=[user, {"type": "web_search_call"}]),
            "items": lambda: add(made.id, items=[]),
            "items (21)": lambda: client.conversations.create(items=[user] * 21),
            "metadata": lambda: client.conversations.create(
                metadata={str(i): "v" for i in range(17)}
            ),
            "metadata (513)": lambda: client.conversations.update(
                made.id, metadata={"k": "v" * 513}
            ),
            "limit": lambda: items(made.id, limit=0),
            "limit (101)": lambda: items(made.id, limit=101),
            "after": lambda: items(made.id, after="msg_unknown"),
        }
        for param, attempt in refused.items():
            with pytest.raises(openai.BadRequestError) as raised:
                await attempt()
            assert raised.value.body["param"] == param.split()[0], raised.value.body
        assert [i.id for i in await every(client, made.id)] == [item.id]  # nothing was added
        assert len(await every(client, (await client.conversations.create()).id)) == 0
        raw = await client.conversations.with_raw_response.create(extra_body={"color": "blue"})
        assert raw.headers["x-thinkgate-ignored"] == "color"  # UNKNOWN_FIELDS=ignore


async def test_an_agents_sdk_session_lives_in_a_conversation(stack: Stack) -> None:
    set_tracing_disabled(True)  # no export to OpenAI's tracing service
    config = RunConfig(tracing_disabled=True)
    async with sdk(stack, "visible") as client:
        session = OpenAIConversationsSession(openai_client=client)
        model = OpenAIResponsesModel(model=MODEL, openai_client=client)
        agent: Agent[Any] = Agent(name="brief", instructions="Be brief.", model=model)
        first = await Runner.run(agent, "Why is the sky blue?", session=session, run_config=config)
        second = await Runner.run(agent, "And the sea?", session=session, run_config=config)
        kept = dumped(await every(client, session.session_id, order="asc"))
    assert session.session_id.startswith("conv_")
    assert isinstance(stack.sim, SimApp)
    sent = stack.sim.sim.received[-1]["messages"]
    said = [(m["role"], m["content"]) for m in sent]
    assert said[0] == ("system", "Be brief.")
    assert said[1:] == [("user", "Why is the sky blue?"), ("assistant", first.final_output),
                        ("user", "And the sea?")]  # fmt: skip
    messages = [i for i in kept if i["type"] == "message"]
    assert [(m["role"], m["content"][0]["text"]) for m in messages] == [
        ("user", "Why is the sky blue?"), ("assistant", first.final_output),
        ("user", "And the sea?"), ("assistant", second.final_output)]  # fmt: skip
    assert [i["type"] for i in kept].count("reasoning") == 2  # each turn's, kept for the next


async def test_openai_node_walks_a_conversation(stack: Stack, tmp_path: Path) -> None:
    if not (CLIENTS / "node_modules" / "openai").is_dir():
        pytest.fail(f"openai-node is not installed: npm ci --prefix {CLIENTS} (make test does it)")
    env = clean_env(tmp_path / "node", {"GATEWAY_URL": stack.url, "GATEWAY_ROOT": stack.root,
                                         "GATEWAY_KEY": stack.keys["visible"],
                                         "GATEWAY_MODEL": MODEL})  # fmt: skip
    script = CLIENTS / "openai_conversations.mjs"
    outcome = await run_client(["node", str(script)], env, CLIENTS, 30)
    assert outcome.returncode == 0, outcome.stderr[-4000:]
    got = outcome.result()
    made, added = got["created"], got["added"]
    assert made["object"] == "conversation" and made["metadata"] == {"client": "openai-node"}
    answer, sea = added["data"]
    assert answer["content"] == [{"type": "output_text", "text": "Rayleigh scattering."}]
    assert sea["content"] == [{"type": "input_text", "text": "And the sea?"}]
    listed = [i["id"] for i in got["listed"]]
    assert len(listed) == 3 and listed[1:] == [answer["id"], sea["id"]]
    assert got["listed"][0]["content"] == [{"type": "input_text", "text": "Why is the sky blue?"}]
    assert got["retrieved"] == answer
    assert got["afterDelete"] == made
    assert [i["id"] for i in got["remaining"]] == [listed[0], sea["id"]]
    assert got["deleted"] == {"id": made["id"], "object": "conversation.deleted", "deleted": True}
    assert got["missing"]["status"] == 404
    assert got["missing"]["error"]["type"] == "not_found_error"
