"""``conversation`` on ``/v1/responses`` through the real ``openai`` SDK against the simulator:
the conversation's items come first for the engine (the earlier reasoning included, whatever
the key was shown), each completed turn is appended (input, reasoning, answer), a hidden key
lists no reasoning text, and bad uses are refused naming ``conversation``."""

from __future__ import annotations

import openai
import pytest

from tests.e2e.conftest import RecordingSink, Stack
from tests.e2e.test_background import polled
from tests.e2e.test_responses import expected, sdk
from tests.e2e.test_responses_state import sent, state  # noqa: F401 - the fixture


@pytest.mark.parametrize("key", ["visible", "hidden"])
async def test_each_turn_is_added_and_the_next_one_continues_it(
    state: tuple[Stack, RecordingSink],  # noqa: F811
    key: str,
) -> None:
    stack, _ = state
    first = expected("Be brief.", "Why?")
    async with sdk(stack, key) as client:
        conversation = await client.conversations.create(
            items=[{"type": "message", "role": "system", "content": "Be brief."}]
        )
        one = await client.responses.create(model="deepseek-r1", input="Why?",
                                            conversation=conversation.id)  # fmt: skip
        assert one.conversation is not None and one.conversation.id == conversation.id
        await client.responses.create(model="deepseek-r1", input="And then?",
                                      conversation={"id": conversation.id})  # fmt: skip
        listed = [item async for item in client.conversations.items.list(conversation.id,
                                                                          order="asc")]  # fmt: skip
    messages = sent(stack)["messages"]
    assert messages[0] == {"role": "system", "content": "Be brief."}
    assert messages[1] == {"role": "user", "content": "Why?"}
    assert messages[2]["role"] == "assistant" and first.answer in messages[2]["content"]
    assert (
        messages[2]["reasoning"].strip() == first.reasoning.strip()
    )  # the engine gets it back, hidden or not
    assert messages[-1] == {"role": "user", "content": "And then?"}
    kinds = [item.type for item in listed]
    assert kinds == ["message", "message", "reasoning", "message", "message", "reasoning",
                     "message"]  # fmt: skip
    reasoning_items = [item.model_dump() for item in listed if item.type == "reasoning"]
    text_in_listing = any(item.get("content") for item in reasoning_items)
    assert text_in_listing == (key == "visible")


async def test_a_background_turn_is_added_once_it_completed(
    state: tuple[Stack, RecordingSink],  # noqa: F811,
) -> None:
    stack, _ = state
    async with sdk(stack, "visible") as client:
        conversation = await client.conversations.create()
        queued = await client.responses.create(
            model="deepseek-r1", input="Why?", conversation=conversation.id, background=True
        )
        await polled(client, queued.id)
        listed = [item async for item in client.conversations.items.list(conversation.id,
                                                                          order="asc")]  # fmt: skip
    assert [item.type for item in listed] == ["message", "reasoning", "message"]


async def test_bad_uses_of_conversation_are_refused_naming_it(
    state: tuple[Stack, RecordingSink],  # noqa: F811,
) -> None:
    stack, _ = state
    async with sdk(stack, "visible") as client:
        with pytest.raises(openai.NotFoundError) as unknown:
            await client.responses.create(model="deepseek-r1", input="Why?",
                                          conversation="conv_unknown")  # fmt: skip
        assert unknown.value.body["param"] == "conversation"  # type: ignore[index]
        mine = await client.conversations.create()
        done = await client.responses.create(model="deepseek-r1", input="Why?")
        with pytest.raises(openai.BadRequestError) as both:
            await client.responses.create(
                model="deepseek-r1",
                input="Why?",
                conversation=mine.id,
                previous_response_id=done.id,
            )
        assert both.value.body["param"] == "conversation"  # type: ignore[index]
    async with sdk(stack, "other") as other:  # another tenant's conversation: as unknown
        with pytest.raises(openai.NotFoundError):
            await other.responses.create(model="deepseek-r1", input="Why?",
                                         conversation=mine.id)  # fmt: skip
