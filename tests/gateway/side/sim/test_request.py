"""Request parsing: the fields the vLLM 0.32 behaviours depend on (``stop``, ``sim.merge``)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.side.sim.config import SimConfig
from gateway.side.sim.request import SimRequestError, parse_chat_request
from tests.gateway.side.sim.clients import chat


def parse(**extra: Any) -> Any:
    return parse_chat_request(orjson.dumps(chat(**extra)), SimConfig())


@pytest.mark.parametrize(
    ("stop", "stops"),
    [(None, ()), ("</s>", ("</s>",)), ("", ()), ([], ()), (["a", "", "bc"], ("a", "bc"))],
)
def test_stop_is_a_string_or_a_list_of_strings(stop: Any, stops: tuple[str, ...]) -> None:
    assert parse(stop=stop).stops == stops
    assert parse().stops == ()


@pytest.mark.parametrize("stop", [3, ["a", 1], {"a": 1}, [None]])
def test_other_stops_are_400(stop: Any) -> None:
    with pytest.raises(SimRequestError) as info:
        parse(stop=stop)
    assert (info.value.status, info.value.param) == (400, "stop")


def test_merge_defaults_to_one_token_per_delta() -> None:
    assert parse().sim.merge == 1
    assert parse(sim={"merge": 4}).sim.merge == 4


@pytest.mark.parametrize("merge", [0, -1, 1.5, "2", True])
def test_merge_must_be_a_positive_int(merge: Any) -> None:
    with pytest.raises(SimRequestError) as info:
        parse(sim={"merge": merge})
    assert info.value.status == 400
