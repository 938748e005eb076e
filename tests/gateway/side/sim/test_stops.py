"""Stop strings end a choice where vLLM 0.32 would: at the token that completes one."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gateway.side.sim.pieces import Piece
from gateway.side.sim.stops import end_generation, find_stop


def pieces(*texts: str) -> list[Piece]:
    return [Piece("content", text) for text in texts]


def test_no_stop_and_no_budget_ends_at_eos() -> None:
    ending = end_generation(pieces("a", "b"), (), None)
    assert (ending.pieces, ending.finish_reason, ending.stop_reason) == (
        tuple(pieces("a", "b")),
        "stop",
        None,
    )


def test_the_first_stop_to_complete_wins() -> None:
    # "bc" completes at 3, before "abcd" (which starts earlier) completes at 4.
    hit = find_stop("xabcd", ["abcd", "bc"])
    assert hit is not None
    assert (hit.stop, hit.start, hit.end) == ("bc", 2, 4)
    tie = find_stop("xabc", ["bc", "abc"])
    assert tie is not None
    assert tie.stop == "abc"
    assert find_stop("abc", ["", "zz"]) is None


def test_a_stop_across_tokens_empties_the_tokens_after_its_start() -> None:
    ending = end_generation(pieces("x<", "/th", "ink>", "tail"), ["</think>"], None)
    assert [p.text for p in ending.pieces] == ["x", "", ""]
    assert (ending.finish_reason, ending.stop_reason) == ("stop", "</think>")


def test_a_stop_at_the_very_start_leaves_no_text_but_one_token() -> None:
    ending = end_generation(pieces("Hello", " there"), ["He"], 10)
    assert [p.text for p in ending.pieces] == [""]


@given(
    st.lists(st.text("abc", min_size=1, max_size=4), max_size=8),
    st.lists(st.text("abc", min_size=1, max_size=3), max_size=3),
)
def test_text_ends_before_the_stop_and_every_generated_token_counts(
    texts: list[str], stops: list[str]
) -> None:
    ending = end_generation(pieces(*texts), stops, None)
    whole = "".join(texts)
    kept = "".join(p.text for p in ending.pieces)
    hit = find_stop(whole, stops)
    if hit is None:
        assert (kept, ending.stop_reason) == (whole, None)
        return
    assert kept == whole[: hit.start]
    assert ending.stop_reason == hit.stop
    assert hit.end <= len("".join(texts[: len(ending.pieces)]))
    assert hit.end > len("".join(texts[: len(ending.pieces) - 1]))
