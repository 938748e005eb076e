"""Fuzzing the request edge: ``parse_chat_request`` alone, then the whole HTTP surface.

``parse_chat_request`` gets arbitrary bytes, arbitrary JSON documents and near-valid requests
with one field changed: it returns a ``ChatRequest`` or raises ``InvalidRequest`` (400, an OpenAI
error body whose ``param`` is ``None`` or names the field at fault), and a valid request reaches
``upstream_body`` with every field it did not consume unchanged.

The API fuzz sends generated requests (any method, the app's own routes and some that do not
exist, random query strings, bodies and headers, real and garbage keys) to a gateway on a real
socket in front of the simulator: no 5xx but the documented upstream and ledger ones (502, 503,
504), and every error is an OpenAI error object. The OpenAPI document is not used: it declares no
request bodies, parameters or security (every route reads its ``Request`` directly), so a
schema-driven fuzzer would generate nothing but empty requests.
"""

from __future__ import annotations

import base64
import functools
import string
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from gateway.api.chat import ChatRequest, _ChatBody, _checked, _invalid, parse_chat_request
from gateway.api.fields import CHAT
from gateway.api.jsonbody import MAX_DEPTH, _check_depth, _shallow
from gateway.app import create_app
from gateway.errors import InvalidRequest
from gateway.settings import Settings
from tests.e2e.conftest import Stack, StackFactory, stack_factory
from tests.openai_errors import assert_openai_error as check_openai_error

__all__ = ["stack_factory"]  # the real-socket stack fixture of tests/e2e, used here

# --- parse_chat_request --------------------------------------------------------------------------

FIELDS = ("model", "messages", "stream", "stream_options", "n", "max_tokens",
          "max_completion_tokens", "include_reasoning", "reasoning", "temperature", "top_p",
          "presence_penalty", "frequency_penalty", "seed", "logprobs", "top_logprobs",
          "user")  # fmt: skip
ROLES = ("system", "developer", "user", "assistant", "tool", "function")
CONSUMED = ("include_reasoning", "reasoning")  # directives to the gateway, never forwarded


def json_values(ints: st.SearchStrategy[int], texts: st.SearchStrategy[str]) -> Any:
    scalars = st.none() | st.booleans() | ints | texts
    scalars |= st.floats(allow_nan=False, allow_infinity=False)
    return st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
        max_leaves=10,
    )


# Every JSON value orjson can write (its integers are 64-bit, signed or not).
JSON = json_values(st.integers(-(2**63), 2**64 - 1), st.text(max_size=8))
# Values a field is most likely to be tested against.
EDGY = st.one_of(
    st.sampled_from([0, 1, -1, 16, 17, 10**6, 10**6 + 1, 2**63 - 1, 2**64 - 1, -(2**63), 1.0, 0.5,
                     True, False, None, "", "x", "1", "true", [], {}, [None], {"role": "user"}]),
    JSON,
)  # fmt: skip

VALID: dict[str, Any] = {
    "model": "m",
    "messages": [{"role": "user", "content": "hi"}],
    "stream": True,
    "stream_options": {"include_usage": False, "continuous_usage_stats": True},
    "n": 2,
    "max_tokens": 10,
    "max_completion_tokens": 20,
    "include_reasoning": True,
    "reasoning": {"exclude": False, "effort": "low"},
    "temperature": 0.5,
    "top_k": 3,
}
NESTED = (("messages", 0), ("messages", 0, "role"), ("stream_options", "include_usage"),
          ("reasoning", "exclude"))  # fmt: skip
DELETE = object()


def outcome(raw: bytes) -> ChatRequest | InvalidRequest:
    """What parsing ``raw`` gives; anything but ``InvalidRequest`` propagates and fails."""
    try:
        return parse_chat_request(raw)
    except InvalidRequest as exc:
        error = exc
    assert error.status == 400
    assert isinstance(error.message, str) and error.message
    assert error.to_dict() == {
        "error": {
            "message": error.message,
            "type": "invalid_request_error",
            "param": error.param,
            "code": "invalid_request",
        }
    }
    return error


def param_resolves(body: Any, param: str) -> bool:
    """``param`` is a path into ``body`` whose every step but the last exists (the last may be
    the missing field), and its first step is a field the gateway validates."""
    *parents, last = param.split(".")
    if (parents or [last])[0] not in FIELDS:
        return False
    node = body
    for step in parents:
        if isinstance(node, list) and step.isdigit() and int(step) < len(node):
            node = node[int(step)]
        elif isinstance(node, dict) and step in node:
            node = node[step]
        else:
            return False
    return isinstance(node, dict) or (isinstance(node, list) and last.isdigit())


JSON_FRAGMENTS = st.sampled_from((
    b"{", b"}", b"[", b"]", b",", b":", b'"model"', b'"messages"', b'"role"', b'"n"', b'"m"',
    b"null", b"true", b"1", b"-0", b"1e999", b"NaN", b"99999999999999999999999", b'"\\ud800"',
    b'"\\u0000"', b"\xff", b"\xef\xbb\xbf", b" ", b"\n",
))  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(raw=st.one_of(st.binary(max_size=64), st.lists(JSON_FRAGMENTS, max_size=30).map(b"".join)))
def test_arbitrary_bytes_give_a_request_or_invalid_request(raw: bytes) -> None:
    result = outcome(raw)
    if isinstance(result, InvalidRequest) and result.param is not None:
        assert param_resolves(orjson.loads(raw), result.param)


@settings(max_examples=150, deadline=None)
@given(document=st.one_of(JSON, st.dictionaries(st.sampled_from(FIELDS), EDGY, max_size=6)))
def test_arbitrary_json_gives_a_request_or_invalid_request_naming_a_real_field(
    document: Any,
) -> None:
    result = outcome(orjson.dumps(document))
    if isinstance(result, InvalidRequest) and result.param is not None:
        assert param_resolves(document, result.param), result.param


def set_path(body: dict[str, Any], path: tuple[str | int, ...], value: Any) -> None:
    node: Any = body
    for step in path[:-1]:
        node = node[step]
    if value is DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = value


@settings(max_examples=200, deadline=None)
@given(
    path=st.sampled_from([(name,) for name in VALID] + list(NESTED)),
    value=st.one_of(st.just(DELETE), EDGY),
)
def test_a_request_with_one_field_changed_fails_only_on_that_field(
    path: tuple[str | int, ...], value: Any
) -> None:
    body = orjson.loads(orjson.dumps(VALID))
    set_path(body, path, value)
    result = outcome(orjson.dumps(body))
    if isinstance(result, InvalidRequest):
        assert result.param is not None
        assert result.param.split(".")[0] == path[0]
        assert param_resolves(body, result.param)


def expected_upstream(body: dict[str, Any]) -> dict[str, Any]:
    forwarded = {k: v for k, v in body.items() if k not in CONSUMED}
    if body.get("stream"):
        forwarded["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
    return forwarded


# Names no reference has: forwarded as they are (UNKNOWN_FIELDS=ignore)
NAMES = st.text(st.characters(codec="utf-8"), max_size=12).filter(
    lambda k: k not in FIELDS and k not in CHAT
)
TOKENS = st.none() | st.integers(1, 10**6)
VALID_REQUESTS = st.fixed_dictionaries(
    {
        "model": st.text(min_size=1, max_size=256),
        "messages": st.lists(
            st.fixed_dictionaries({"role": st.sampled_from(ROLES)}, optional={"content": JSON}),
            min_size=1,
            max_size=3,
        ),
    },
    optional={
        "stream": st.booleans(),
        "stream_options": st.none()
        | st.fixed_dictionaries({}, optional={"include_usage": st.none() | st.booleans()}),
        "n": st.integers(1, 16),
        "max_tokens": TOKENS,
        "max_completion_tokens": TOKENS,
        "include_reasoning": st.booleans(),
        "reasoning": st.none() | st.fixed_dictionaries({}, optional={"exclude": st.booleans()}),
    },
).flatmap(lambda known: st.dictionaries(NAMES, JSON, max_size=4).map(lambda x: {**x, **known}))


@settings(max_examples=100, deadline=None)
@given(body=VALID_REQUESTS)
def test_a_valid_request_forwards_every_field_it_does_not_consume(body: dict[str, Any]) -> None:
    chat = parse_chat_request(orjson.dumps(body))
    upstream = orjson.loads(chat.upstream_body)
    assert upstream == expected_upstream(body)
    assert chat.params == {k: v for k, v in upstream.items() if k != "messages"}
    assert chat.messages == body["messages"]
    assert (chat.model, chat.n, chat.stream) == (body["model"], body.get("n", 1),
                                                 body.get("stream", False))  # fmt: skip
    assert chat.max_tokens == (body.get("max_completion_tokens") or body.get("max_tokens"))
    assert chat.include_usage is bool((body.get("stream_options") or {}).get("include_usage"))
    excluded = (body.get("reasoning") or {}).get("exclude", False)
    assert chat.wants_reasoning is (body.get("include_reasoning", True) and not excluded)


def nested(depth: int) -> bytes:
    inner = b"[" * depth + b"]" * depth
    return b'{"model":"m","messages":[{"role":"user"}],"x":' + inner + b"}"


def test_nesting_orjson_refuses_to_read_is_invalid_request() -> None:
    """The control for the test below: past orjson's read limit (1024) it is a clean 400."""
    assert isinstance(outcome(nested(1100)), InvalidRequest)


@pytest.mark.parametrize("depth", [MAX_DEPTH, MAX_DEPTH + 1, 252, 254, 600, 1000])
def test_a_field_nested_past_the_limit_is_refused_naming_it(depth: int) -> None:
    """Past ``MAX_DEPTH`` (the body is level 1), refused naming the field, whatever the depth:
    between orjson's write limit (254) and its read limit (1024), such a body used to be read,
    sent to the engine, and then not recorded."""
    result = outcome(nested(depth - 1))
    if depth <= MAX_DEPTH:
        assert isinstance(result, ChatRequest) and orjson.loads(result.upstream_body)["x"]
    else:
        assert isinstance(result, InvalidRequest) and result.param == "x"
        assert f"deeper than {MAX_DEPTH} levels" in result.message


@pytest.mark.parametrize("depth", [MAX_DEPTH, MAX_DEPTH + 1])
def test_a_large_body_is_held_to_the_same_depth(depth: int) -> None:
    """A body past the size up to which brackets are counted (an agent's context) goes to
    orjson's writer at once: the same limit, the same refusal naming the field."""
    padding = b',"p":"' + b"x" * (20 << 10) + b'"'
    raw = nested(depth - 1)[:-1] + padding + b"}"
    assert len(raw) > 20 << 10
    result = outcome(raw)
    if depth <= MAX_DEPTH:
        assert isinstance(result, ChatRequest)
    else:
        assert isinstance(result, InvalidRequest) and result.param == "x"
        assert f"deeper than {MAX_DEPTH} levels" in result.message


def _walk_allows(body: dict[str, Any]) -> bool:
    try:
        _check_depth(body)
    except InvalidRequest:
        return False
    return True


@st.composite
def _nestings(draw: st.DrawFn) -> dict[str, Any]:
    """A body whose fields nest lists and objects to depths around ``MAX_DEPTH``, each level
    maybe with siblings, the innermost container empty or not."""
    fields: dict[str, Any] = {"model": "m"}
    for name in draw(st.lists(st.sampled_from("abc"), min_size=1, max_size=3, unique=True)):
        depth = draw(st.sampled_from((1, 2, MAX_DEPTH - 1, MAX_DEPTH, MAX_DEPTH + 1, 254, 300)))
        value: Any = draw(st.sampled_from(([], {}, [1], {"k": "v"})))
        for _ in range(depth - 2):  # the body is level 1, the field's value level 2
            sibling = draw(st.sampled_from((None, 0, "s", [])))
            if draw(st.booleans()):
                value = [value] if sibling is None else [sibling, value]
            else:
                value = {"n": value} if sibling is None else {"s": sibling, "n": value}
        fields[name] = value
    return fields


@settings(max_examples=300, deadline=None)
@given(_nestings())
def test_orjsons_writer_says_what_the_depth_walk_says(body: dict[str, Any]) -> None:
    """``_shallow`` (one orjson encoding of the body wrapped in lists) lets a body through
    exactly when the walk would: at the limit, one past it, empty or full innermost
    containers, lists and objects mixed."""
    assert _shallow(body) == _walk_allows(body)


_MESSAGE_ITEMS = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(
        ("user", "assistant", "system", "developer", "tool", "function", "robot", "", "User")
    )}, optional={"content": st.sampled_from(("hi", None, 3, ["x"]))}),
    st.fixed_dictionaries({"role": st.sampled_from((None, 1, ["user"], {"r": 1}, True))}),
    st.fixed_dictionaries({"content": st.just("no role")}),
    st.sampled_from(("user", 3, None, ["user"], [])),
)  # fmt: skip


@st.composite
def _chat_bodies(draw: st.DrawFn) -> dict[str, Any]:
    """Chat bodies right and wrong in their messages and in the fields beside them."""
    body: dict[str, Any] = {
        "model": draw(st.sampled_from(("m", "", 1))),
        "messages": draw(st.one_of(st.lists(_MESSAGE_ITEMS, max_size=4),
                                   st.sampled_from(("hi", None, {"role": "user"})))),
    }  # fmt: skip
    for name, values in (("temperature", (0.5, 5, "x")), ("n", (1, 0, "2")),
                         ("stream", (True, "yes")), ("max_tokens", (10, -1))):  # fmt: skip
        if draw(st.booleans()):
            body[name] = draw(st.sampled_from(values))
    return body


@settings(max_examples=500, deadline=None)
@given(_chat_bodies())
def test_the_quick_message_check_answers_as_the_full_model(body: dict[str, Any]) -> None:
    """``_checked`` (the messages' roles tested by hand) accepts what the full model accepts,
    with the same values, and refuses the rest with the full model's own first error."""
    try:
        full: Any = _ChatBody.model_validate(body).model_dump()
    except ValidationError as exc:
        full = _invalid(exc)
    try:
        quick: Any = _checked(body).model_dump()
    except InvalidRequest as exc:
        quick = exc
    if isinstance(full, InvalidRequest):
        assert isinstance(quick, InvalidRequest)
        assert (quick.message, quick.param) == (full.message, full.param)
    else:
        assert quick == full


# --- the API fuzz --------------------------------------------------------------------------------


@functools.cache
def routes() -> tuple[tuple[str, tuple[str, ...]], ...]:
    """(path template, methods) of every route the app serves, plus some it does not."""
    app = create_app(Settings(upstreams=("http://127.0.0.1:9/v1",)))  # not started: no I/O
    served = [(r.path, tuple(sorted(r.methods))) for r in app.framework.routes]  # type: ignore[attr-defined]
    unknown = [("/", ("GET",)), ("/v1", ("GET",)), ("/v1/chat/completions/", ("POST",)),
               ("/v1/completions", ("POST",)),
               ("/audit/v1/records/{index}/x", ("GET",))]  # fmt: skip
    return tuple(served + unknown)


METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD")
SERVER_FAULTS_ALLOWED = {502, 503, 504}  # upstream unreachable/failed, ledger down, timeout
# Integers within SQLite's and PostgreSQL's 64-bit INTEGER (larger ones: the tests below).
DIGITS = st.integers(0, 40).map(str) | st.integers(-5, 2**63 - 1).map(str)
PLAIN = string.ascii_letters + string.digits + "-_.:~ %+/=é*"
TEXT = st.text(st.sampled_from(PLAIN), max_size=12)
TIMES = st.sampled_from((
    "0", "1e400", "nan", "-inf", "2026-01-01T00:00:00Z", "2026-01-01", "yesterday",
    "0001-01-01T00:00:00+05:00", "9999-12-31T23:59:59-05:00",
))  # fmt: skip
CURSORS = st.integers(-(10**9), 10**9).map(lambda i: base64.b64encode(str(i).encode()).decode())
QUERY_VALUES = st.one_of(DIGITS, TEXT, TIMES, CURSORS, st.sampled_from(["*", "acme", ""]))
QUERY_NAMES = st.sampled_from(["index", "tree_size", "first", "second", "limit", "cursor",
                               "tenant", "since", "until", "key_id", "model", "status", "kind",
                               "request_id", "x"])  # fmt: skip
HEADER_TEXT = st.text(st.characters(min_codepoint=0x21, max_codepoint=0xFF,
                                    exclude_characters="\x7f"), max_size=40)  # fmt: skip
# Small integers only: a generated valid chat request is answered, so it must stay quick.
API_JSON = json_values(st.integers(-3, 40), TEXT)


ROLE_KEYS = {"/v1/": ("visible", "hidden"), "/audit/": ("auditor",), "/admin/": ("admin",)}
ROUTE_PARAMS = {
    "/audit/v1/records": ("limit", "cursor", "tenant", "since", "until", "key_id", "model",
                          "status", "kind", "request_id"),
    "/audit/v1/proof/inclusion": ("index", "tree_size"),
    "/audit/v1/proof/consistency": ("first", "second"),
    "/audit/v1/export": ("tenant", "since", "until"),
    "/admin/v1/keys": ("tenant",),
}  # fmt: skip


def authorizations(keys: dict[str, str], path: str) -> st.SearchStrategy[str | None]:
    """Mostly a key of the role the route wants (to get past authentication), else anything."""
    right = [keys[name] for prefix, names in ROLE_KEYS.items() if path.startswith(prefix)
             for name in names] or list(keys.values())  # fmt: skip
    real = sorted(keys.values())
    anything = st.one_of(
        st.none(),
        st.sampled_from(real).map(lambda key: f"Bearer {key}"),
        st.sampled_from(real).map(lambda key: f"bearer  {key}"),
        st.sampled_from(real).map(lambda key: f"Bearer {key[:-1]}"),
        st.sampled_from(real).map(lambda key: f"Basic {key}"),
        st.sampled_from(["Bearer", "Bearer sk-tg-", "Bearer sk-tg-000000000000-" + "A" * 43]),
        HEADER_TEXT.filter(bool).map(lambda text: f"Bearer {text}"),
        HEADER_TEXT,
    )
    return weighted(st.sampled_from(right).map(lambda key: f"Bearer {key}"), anything)


def weighted(likely: st.SearchStrategy[Any], other: st.SearchStrategy[Any], odds: int = 5) -> Any:
    """``likely`` about ``odds`` times in ``odds + 1`` (``one_of`` would merge the copies)."""
    return st.sampled_from([*[likely] * odds, other]).flatmap(lambda chosen: chosen)


def chat_bodies(model: str) -> st.SearchStrategy[bytes]:
    base = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    fields = st.sampled_from((
        "model", "messages", "stream", "stream_options", "n", "max_tokens",
        "include_reasoning", "reasoning", "stop", "temperature", "x",
    ))  # fmt: skip
    values = st.one_of(st.booleans(), st.sampled_from([model, {"exclude": True}]), API_JSON)
    changes = st.dictionaries(fields, values, max_size=3)
    return changes.map(lambda change: orjson.dumps({**base, **change}))


def bodies(model: str, path: str) -> st.SearchStrategy[bytes | None]:
    anything = st.one_of(st.none(), st.binary(max_size=40), API_JSON.map(orjson.dumps))
    if path == "/v1/chat/completions":
        return weighted(chat_bodies(model), anything)
    if path == "/admin/v1/keys":
        optional = {"role": TEXT | API_JSON, "reasoning": TEXT, "rpm": API_JSON, "tpm": API_JSON}
        keys = st.fixed_dictionaries({"tenant": TEXT}, optional=optional)
        return weighted(keys.map(orjson.dumps), anything)
    return anything


@st.composite
def api_requests(draw: st.DrawFn, keys: dict[str, str], model: str) -> dict[str, Any]:
    chat = st.just(("/v1/chat/completions", ("POST",)))
    template, methods = draw(weighted(chat, st.sampled_from(routes()), odds=1))
    method = draw(weighted(st.sampled_from(methods), st.sampled_from(METHODS)))
    path = template.replace("{index}", quote(draw(DIGITS | TEXT), safe=""))
    path = path.replace("{key_id}", quote(draw(TEXT), safe=""))
    headers = {}
    if (auth := draw(authorizations(keys, path))) is not None:
        headers["authorization"] = auth
    optional = {"x-thinkgate-priority": st.sampled_from(["critical", "standard", "sheddable"])
                | HEADER_TEXT, "traceparent": HEADER_TEXT, "x-request-id": HEADER_TEXT,
                "content-type": st.sampled_from(["application/json", "text/plain"])}  # fmt: skip
    for name, values in optional.items():
        if not draw(st.integers(0, 3)):
            headers[name] = draw(values)
    names = weighted(st.sampled_from(ROUTE_PARAMS.get(path, ("x",))), QUERY_NAMES)
    return {
        "method": method,
        "url": path,
        "params": draw(st.dictionaries(names, QUERY_VALUES, max_size=4)),
        "headers": {k: v.encode("latin-1") for k, v in headers.items()},
        "content": draw(bodies(model, path)),
    }


def assert_openai_error(response: httpx.Response) -> None:
    """The error in the shape of the API its path belongs to: Anthropic's under /v1/messages."""
    if response.request.url.path.startswith("/v1/messages"):
        body = response.json()
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
        assert isinstance(body["error"]["message"], str) and body["error"]["message"]
        return
    check_openai_error(response, request_id=False)


async def send(client: httpx.AsyncClient, request: dict[str, Any]) -> httpx.Response:
    response = await client.request(**request)
    assert response.headers.get("x-request-id"), "every response carries a request id"
    status = response.status_code
    assert status < 500 or status in SERVER_FAULTS_ALLOWED, (status, response.text[:300])
    if status >= 400 and request["method"] != "HEAD":
        assert_openai_error(response)
    return response


@dataclass(frozen=True, slots=True)
class Target:
    client: httpx.AsyncClient
    keys: dict[str, str]
    model: str


@pytest.fixture
async def target(stack_factory: StackFactory) -> AsyncIterator[Target]:
    """One gateway for all of a test's examples (function-scoped: made once, not per example)."""
    stack: Stack = await stack_factory()
    async with httpx.AsyncClient(base_url=stack.root, timeout=10) as client:
        auth = {"authorization": f"Bearer {stack.keys['visible']}"}
        model = (await client.get("/v1/models", headers=auth)).json()["data"][0]["id"]
        yield Target(client, stack.keys, model)


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
async def test_api_fuzz_never_fails_with_an_unexpected_5xx(
    target: Target, data: st.DataObject
) -> None:
    await send(target.client, data.draw(api_requests(target.keys, target.model)))


# --- 500s the API fuzz finds once its integers and nesting are not kept small -------------------


async def status_of(target: Target, role: str, method: str, url: str, **kwargs: Any) -> int:
    headers = {"authorization": f"Bearer {target.keys[role]}"}
    response = await target.client.request(method, url, headers=headers, **kwargs)
    if response.status_code >= 400:
        assert_openai_error(response)
    return response.status_code


async def test_an_auditor_integer_of_5000_digits_is_a_400(target: Target) -> None:
    digits = "9" * 5000
    assert await status_of(target, "auditor", "GET", f"/audit/v1/records/{digits}") == 400


async def test_auditor_integers_beyond_64_bits_are_a_4xx(target: Target) -> None:
    big, bigger = str(2**63), str(2**63 + 1)
    cursor = base64.b64encode(big.encode()).decode()
    statuses = [
        await status_of(target, "auditor", "GET", f"/audit/v1/records/{big}"),
        await status_of(
            target,
            "auditor",
            "GET",
            "/audit/v1/proof/inclusion",
            params={"index": big, "tree_size": bigger},
        ),
        await status_of(target, "auditor", "GET", "/audit/v1/records", params={"cursor": cursor}),
    ]
    assert all(400 <= status < 500 for status in statuses), statuses


async def test_an_admin_rate_limit_beyond_the_column_is_a_400(target: Target) -> None:
    body = orjson.dumps({"tenant": "acme", "rpm": 2**63})
    assert await status_of(target, "admin", "POST", "/admin/v1/keys", content=body) == 400


async def test_a_deeply_nested_chat_request_is_not_a_500(target: Target) -> None:
    body = nested(300).replace(b'"m"', orjson.dumps(target.model), 1)
    status = await status_of(target, "visible", "POST", "/v1/chat/completions", content=body)
    assert status < 500
