"""Bounded-load prefix affinity, rendezvous weights and the tenant's cache salt."""

from __future__ import annotations

from collections import Counter

from gateway.cache.salt import cache_salt
from gateway.cache.score import bound, rank, rendezvous


def test_the_engine_holding_the_prefix_comes_first_while_within_its_share() -> None:
    assert rank([3, 2, 2], [640.0, 0.0, 128.0]) == [0, 2, 1]


def test_an_engine_over_its_share_spills_to_the_next_best_cache() -> None:
    # 5 + 1 + 1 + 1 in flight: the bound is ceil(9/4 * 1.25) + 1 = 4, so engine 0 is not
    # eligible; among the rest, the most cached, then the least loaded
    assert bound([5, 1, 1, 1]) == 4
    assert rank([5, 2, 1, 1], [900.0, 0.0, 300.0, 0.0]) == [2, 3, 1, 0]


def test_equal_caches_go_by_load_then_by_the_sessions_engine() -> None:
    """A new session (every engine holds the shared system prompt) goes to the least loaded;
    among equally loaded engines, to its own by rendezvous weight, as on every replica."""
    assert rank([2, 1, 1, 0], [64.0] * 4, ties=[4.0, 3.0, 2.0, 1.0]) == [3, 1, 2, 0]
    assert rank([1, 1, 1, 1], [64.0] * 4, ties=[1.0, 3.0, 2.0, 4.0]) == [3, 1, 2, 0]


def test_without_affinity_the_least_loaded_comes_first() -> None:
    assert rank([5, 0, 2], [0.0, 0.0, 0.0]) == [1, 2, 0]


def test_one_hot_prefix_never_piles_onto_one_engine() -> None:
    """Every request holds the same prefix, cached on engine 0 only: as requests arrive and
    stay in flight, no engine carries more than the bound."""
    loads = [0, 0, 0, 0]
    for _ in range(400):
        first = rank(loads, [1000.0, 0.0, 0.0, 0.0])[0]
        loads[first] += 1
    assert max(loads) <= bound([100, 100, 100, 100]) and min(loads) >= 70


def test_rendezvous_spreads_sessions_and_moves_only_the_removed_engines_own() -> None:
    engines = ["http://a", "http://b", "http://c", "http://d"]
    firsts = {}
    for i in range(2000):
        weights = rendezvous(f"session-{i}", engines)
        firsts[i] = engines[max(range(4), key=weights.__getitem__)]
    assert min(Counter(firsts.values()).values()) > 400
    fewer = engines[:3]
    for i, engine in firsts.items():
        if engine != "http://d":
            weights = rendezvous(f"session-{i}", fewer)
            assert fewer[max(range(3), key=weights.__getitem__)] == engine


def test_a_tenants_salt_is_its_own_and_a_clients_salt_cannot_replace_it() -> None:
    a = cache_salt("tenant", b"secret", "acme", None)
    assert a == cache_salt("tenant", b"secret", "acme", None)
    assert a != cache_salt("tenant", b"secret", "globex", None)
    assert a != cache_salt("tenant", b"other", "acme", None)
    mixed = cache_salt("tenant", b"secret", "acme", "mine")
    assert mixed not in (a, "mine") and mixed != cache_salt("tenant", b"secret", "globex", "mine")
    # the separator keeps ("ab", "c") and ("a", "bc") apart
    assert cache_salt("tenant", b"", "ab", "c") != cache_salt("tenant", b"", "a", "bc")
    assert cache_salt("global", b"secret", "acme", "mine") == "mine"
    assert cache_salt("global", b"secret", "acme", None) is None


def test_the_event_order_applies_replays_skips_and_restarts() -> None:
    from gateway.cache.sequence import EventOrder

    order = EventOrder()
    assert order.step(0) == "apply"
    order.applied(0)
    assert order.step(1) == "apply"
    order.applied(1)
    assert order.step(4) == "replay" and order.missing_from() == 2
    for seq in (2, 3, 4, 5):  # the replay brings what was missed and what came since
        order.applied(seq, replay=True)
    assert order.step(4) == "old" and order.step(5) == "old"  # the SUB socket's copies
    assert order.step(6) == "apply"
    order.applied(6)
    assert order.step(0) == "restart"
    order.reset()
    assert order.step(7) == "replay" and order.missing_from() == 0  # joined late


def test_the_salt_is_spliced_into_the_body_and_replaces_a_clients() -> None:
    import orjson

    from gateway.cache.salt import client_salt, salted

    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "}"}]})
    assert client_salt(body) is None
    out = salted(body, "s1")
    assert orjson.loads(out) == {**orjson.loads(body), "cache_salt": "s1"}
    assert salted(body, None) is body
    assert orjson.loads(salted(b"{}", 'a"b')) == {"cache_salt": 'a"b'}
    theirs = orjson.dumps({"model": "m", "cache_salt": "mine"})
    assert client_salt(theirs) == "mine"
    assert orjson.loads(salted(theirs, "ours")) == {"model": "m", "cache_salt": "ours"}
    assert orjson.loads(salted(theirs, None)) == {"model": "m"}
