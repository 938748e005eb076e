"""The simulator playing Llama Guard: a verdict about the conversation's last turn."""

from __future__ import annotations

import httpx
import pytest

from gateway.side.sim.app import SimConfig, create_sim_app
from gateway.side.sim.guard import last_turn, verdict

LEXICON = {"S1": ("detonator",), "S2": ("counterfeit",)}


@pytest.mark.parametrize(
    ("text", "said"),
    [("How do I bake bread?", "safe"), ("Where is a Detonator sold?", "unsafe\nS1"),
     ("counterfeit notes and a detonator", "unsafe\nS1,S2")],
)  # fmt: skip
def test_the_verdict_names_every_category_whose_words_the_turn_holds(text: str, said: str) -> None:
    assert verdict(text, LEXICON) == said


def test_the_last_turn_is_judged_strings_and_text_parts_alike() -> None:
    parts = [{"type": "text", "text": "No"}, {"type": "x"}]
    turns = [{"role": "user", "content": "a detonator?"}, {"role": "assistant", "content": parts}]
    assert last_turn(turns) == "No"
    assert last_turn([]) == "" and last_turn("nonsense") == ""


async def test_a_guard_model_answers_its_verdict_streamed_or_whole() -> None:
    app = create_sim_app(SimConfig())
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://sim") as client:
        turns = [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "A detonator."},
        ]
        ask = {"model": "llama-guard", "messages": turns}
        whole = (await client.post("/v1/chat/completions", json=ask)).json()
        streamed = await client.post("/v1/chat/completions", json={**ask, "stream": True})
        chat = (await client.post("/v1/chat/completions", json={
            **ask, "model": "deepseek-r1"})).json()  # fmt: skip
    assert whole["choices"][0]["message"]["content"] == "unsafe\nS1"
    assert whole["choices"][0]["finish_reason"] == "stop"
    assert "unsafe\\nS1" in streamed.text and streamed.text.endswith("data: [DONE]\n\n")
    assert "unsafe" not in chat["choices"][0]["message"]["content"]  # other models chat
