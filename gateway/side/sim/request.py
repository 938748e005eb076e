"""Parse and validate a chat completion request the way vLLM's OpenAI server does (sans-I/O).

``parse_chat_request(body, config) -> SimRequest`` or raises ``SimRequestError``, which
renders vLLM's error shape ``{"error": {"message", "type", "param", "code"}}``.

Rules (vLLM 0.32 behaviour where it has one):

- ``model`` absent means the first served model; an unknown one is 404 ``NotFoundError``.
- ``messages`` must be a non-empty list; contents are strings or lists of text parts.
- ``max_tokens`` (or ``max_completion_tokens``) defaults to what the context has left;
  prompt plus completion beyond ``max_model_len`` is 400 with vLLM's context message.
- ``stop`` is null, a string or a list of strings (else 400); empty strings are dropped.
  How stops end a choice: ``gateway.side.sim.stops``; what they do to a separated stream:
  ``gateway.side.sim.deltas`` (vLLM #51641).
- ``n`` >= 1; choice ``i`` uses seed ``seed + i``. The seed is the request's ``seed``, else
  ``sim.seed``, else a stable hash of the message text (same prompt, same output). What the
  model says is about the user's question (``question``; ``gateway.side.sim.prose``).
- The extra ``sim`` object scripts the simulator for tests; every field is optional:
  ``chunks`` (strings, each one ``content`` token, or ``[channel, text]`` pairs that set the
  channel explicitly), ``mode``, ``seed``, ``ttft_ms``, ``itl_ms``, ``stall_ms``, ``fail``
  (``drop``/``error``/``stall``), ``fail_after`` (emissions), ``reasoning_tokens`` (int or null:
  overrides ``usage.completion_tokens_details``), ``merge`` (int >= 1, default 1: tokens
  per streamed delta, as vLLM under load sends them; see ``gateway.side.sim.deltas``),
  ``format`` (a ``gateway.relay.formats`` name with text markers: the model writes its markers;
  default: the model's, see ``SimConfig.formats``), ``empty_reasoning`` (bool: the model
  thinks nothing, see ``gateway.side.sim.script``).
- Tools: ``tools`` and ``tool_choice`` are checked, and the call decided, by
  ``gateway.side.sim.tools``: on ``auto`` the model calls only when the conversation ends with the
  user's question and a tool fits it (``gateway.side.sim.fit``), with arguments sampled from the
  tool's schema (``gateway.side.sim.arguments``) or ``sim.tool_arguments`` (an object) if given;
  after a tool result it answers in prose, about the result (``SimRequest.result``).
- What the model talks about (``SimRequest.question``) is the user's last question, read by
  ``gateway.side.sim.turn``: agent clients' wrapper blocks (``<system-reminder>``,
  ``<environment_context>`` ...) removed, the last text part that has text.
- ``continue_final_message: true`` (with ``add_generation_prompt: false``) after an assistant
  message whose text holds the format's close marker continues that turn after its
  reasoning: the model writes only its answer, as content (``gateway.side.sim.script``). This is
  how the gateway ends a reasoning at its budget (``gateway.relay.effort``).
- Thinking is off, as a hybrid model's template does it, when ``chat_template_kwargs`` has
  ``thinking`` or ``enable_thinking`` false, or ``reasoning_effort`` is ``"none"``: the model
  writes only its answer (``gateway.side.sim.script``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import orjson

from gateway.relay.formats import BUILTIN
from gateway.side.sim.config import SimConfig
from gateway.side.sim.errors import SimRequestError, bad_request, error_body
from gateway.side.sim.script import (
    Channel,
    Piece,
    SimMode,
    ToolPlan,
    count_prompt_tokens,
    derive_seed,
)
from gateway.side.sim.state import FailMode
from gateway.side.sim.tools import plan_tool
from gateway.side.sim.turn import ToolResult, read_turn

__all__ = [
    "ReasoningOverride",
    "SimOptions",
    "SimRequest",
    "SimRequestError",
    "error_body",
    "parse_chat_request",
]

ReasoningOverride = int | None | Literal["auto"]


@dataclass(frozen=True, slots=True)
class SimOptions:
    """The ``sim`` extension object; ``None`` means "use the configured default"."""

    chunks: tuple[Piece, ...] | None = None
    mode: SimMode | None = None
    seed: int | None = None
    ttft_ms: float | None = None
    itl_ms: float | None = None
    stall_ms: float | None = None
    fail: FailMode | None = None
    fail_after: int | None = None
    reasoning_tokens: ReasoningOverride = "auto"
    merge: int = 1
    format: str | None = None
    empty_reasoning: bool = False
    tool_arguments: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class SimRequest:
    """A validated request with every default resolved."""

    model: str
    mode: SimMode
    prompt_tokens: int
    max_tokens: int
    n: int
    seed: int
    stream: bool
    include_usage: bool
    stops: tuple[str, ...]
    sim: SimOptions
    markers: tuple[str | None, str] = ("<think>", "</think>")
    thinking: bool = True
    tool: ToolPlan | None = None
    body: dict[str, Any] = field(default_factory=dict)  # the request as received
    continuing: bool = False  # continues an assistant turn whose reasoning is closed
    question: str = ""  # the user's question: what the model's text is about
    result: ToolResult | None = None  # the tool result the model answers, if it answers one
    prompt: str = ""  # the messages' text: what the simulator tokenizes and caches
    cache_salt: str | None = None  # vLLM's: the prompt's first block is keyed on it


def parse_chat_request(body: bytes, config: SimConfig) -> SimRequest:
    """Validate ``body`` against ``config``; raise ``SimRequestError`` as vLLM would."""
    data = _load_object(body)
    model = _resolve_model(data.get("model"), config)
    text = _prompt_text(data.get("messages"))
    prompt_tokens = count_prompt_tokens(text)
    sim = _parse_sim(data.get("sim"))
    stream = _typed(data, "stream", bool, False)
    options = data.get("stream_options")
    turn = read_turn(data["messages"])
    return SimRequest(
        model=model,
        mode=sim.mode or config.models[model],
        prompt_tokens=prompt_tokens,
        max_tokens=_max_tokens(data, prompt_tokens, config.max_model_len),
        n=_positive(data, "n", 1),
        seed=_seed(data, sim, text),
        stream=stream,
        include_usage=stream and isinstance(options, dict) and options.get("include_usage") is True,
        stops=_stops(data.get("stop")),
        sim=sim,
        markers=_markers(sim.format or config.formats.get(model, "deepseek_r1")),
        thinking=_thinking(data),
        tool=plan_tool(data, turn, sim.tool_arguments),
        body=data,
        continuing=_continuing(data, config.formats.get(model, "deepseek_r1"), sim),
        question=turn.question,
        result=turn.result,
        prompt=text,
        cache_salt=_salt(data.get("cache_salt")),
    )


def _salt(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise bad_request("'cache_salt' must be a non-empty string", "cache_salt")
    return value


def prompt_text_of(data: Any) -> str:
    """The text the simulator tokenizes for a ``/tokenize`` body (chat messages or a prompt)."""
    if isinstance(data, dict) and isinstance(data.get("prompt"), str):
        return str(data["prompt"])
    return _prompt_text(data.get("messages") if isinstance(data, dict) else None)


def _markers(name: str) -> tuple[str | None, str]:
    fmt = BUILTIN.get(name)
    if fmt is None or not fmt.splits or fmt.close is None:
        raise bad_request("'sim.format' must name a format with text markers", "sim")
    return fmt.open, fmt.close


def _continuing(data: dict[str, Any], model_format: str, sim: SimOptions) -> bool:
    """``continue_final_message`` after an assistant message whose reasoning is closed."""
    messages = data.get("messages")
    if data.get("continue_final_message") is not True or not isinstance(messages, list):
        return False
    last = messages[-1] if messages else None
    if not isinstance(last, dict) or last.get("role") != "assistant":
        return False
    close = _markers(sim.format or model_format)[1]
    return close in _content_text(last)


def _thinking(data: dict[str, Any]) -> bool:
    kwargs = data.get("chat_template_kwargs")
    switches = (
        (kwargs.get("thinking"), kwargs.get("enable_thinking")) if isinstance(kwargs, dict) else ()
    )
    if False in switches:
        return False
    return data.get("reasoning_effort") != "none"


def _load_object(body: bytes) -> dict[str, Any]:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise bad_request(f"Invalid JSON body: {exc}") from None
    if not isinstance(data, dict):
        raise bad_request("The request body must be a JSON object")
    return data


def _resolve_model(model: object, config: SimConfig) -> str:
    if model is None:
        return next(iter(config.models))
    if not isinstance(model, str) or model not in config.models:
        message = f"The model `{model}` does not exist."
        raise SimRequestError(404, "NotFoundError", message, "model")
    return model


def _prompt_text(messages: object) -> str:
    """All message text joined; what the simulator counts and hashes."""
    if not isinstance(messages, list) or not messages:
        raise bad_request("Field required: 'messages' must be a non-empty list", "messages")
    return "\n".join(_content_text(message) for message in messages)


def _content_text(message: object) -> str:
    if not isinstance(message, dict):
        raise bad_request("Each message must be an object", "messages")
    content = message.get("content")
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    raise bad_request("Message content must be a string or a list of parts", "messages")


def _typed(data: dict[str, Any], key: str, kind: type[Any], default: Any) -> Any:
    """``data[key]`` if present and not null, checked to be a ``kind`` (bool is not a number)."""
    value = data.get(key)
    if value is None:
        return default
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise bad_request(f"'{key}' must be of type {kind.__name__}", key)
    return value


def _positive(data: dict[str, Any], key: str, default: int | None) -> Any:
    value = _typed(data, key, int, default)
    if value is not None and value < 1:
        raise bad_request(f"'{key}' must be at least 1, got {value}", key)
    return value


def _max_tokens(data: dict[str, Any], prompt_tokens: int, max_model_len: int) -> int:
    """The completion budget: as requested, else what the context has left."""
    requested = _positive(data, "max_completion_tokens", None) or _positive(
        data, "max_tokens", None
    )
    completion = max(1, max_model_len - prompt_tokens) if requested is None else int(requested)
    if prompt_tokens + completion > max_model_len:
        raise bad_request(
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {prompt_tokens + completion} tokens ({prompt_tokens} in the messages, "
            f"{completion} in the completion). Please reduce the length of the messages or "
            "completion.",
            "max_tokens",
        )
    return completion


def _seed(data: dict[str, Any], sim: SimOptions, text: str) -> int:
    seed = _typed(data, "seed", int, None)
    if seed is not None:
        return int(seed)
    return sim.seed if sim.seed is not None else derive_seed(text)


def _parse_sim(raw: object) -> SimOptions:
    if raw is None:
        return SimOptions()
    if not isinstance(raw, dict):
        raise bad_request("'sim' must be an object", "sim")
    return SimOptions(
        chunks=_chunks(raw.get("chunks")),
        mode=_choice(raw, "mode", get_args(SimMode)),
        seed=_typed(raw, "seed", int, None),
        ttft_ms=_delay(raw, "ttft_ms"),
        itl_ms=_delay(raw, "itl_ms"),
        stall_ms=_delay(raw, "stall_ms"),
        fail=_choice(raw, "fail", get_args(FailMode)),
        fail_after=_typed(raw, "fail_after", int, None),
        reasoning_tokens=_typed(raw, "reasoning_tokens", int, None)
        if "reasoning_tokens" in raw
        else "auto",
        merge=_positive(raw, "merge", 1),
        format=_typed(raw, "format", str, None),
        empty_reasoning=bool(_typed(raw, "empty_reasoning", bool, False)),
        tool_arguments=_typed(raw, "tool_arguments", dict, None),
    )


def _stops(raw: object) -> tuple[str, ...]:
    """vLLM's ``stop``: one string or a list of them."""
    if raw is None or isinstance(raw, str):
        return (raw,) if raw else ()
    if isinstance(raw, list) and all(isinstance(stop, str) for stop in raw):
        return tuple(stop for stop in raw if stop)
    raise bad_request("'stop' must be a string or a list of strings", "stop")


def _choice(raw: dict[str, Any], key: str, allowed: tuple[str, ...]) -> Any:
    value = _typed(raw, key, str, None)
    if value is not None and value not in allowed:
        raise bad_request(f"'sim.{key}' must be one of {', '.join(allowed)}", "sim")
    return value


def _delay(raw: dict[str, Any], key: str) -> float | None:
    value = raw.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise bad_request(f"'sim.{key}' must be a number >= 0", "sim")
    return float(value)


def _chunks(raw: object) -> tuple[Piece, ...] | None:
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise bad_request("'sim.chunks' must be a list", "sim")
    return tuple(_chunk(item) for item in raw)


def _chunk(item: object) -> Piece:
    """A string is a content token; ``[channel, text]`` names the channel."""
    if isinstance(item, str):
        return Piece("content", item)
    channels: tuple[Channel, ...] = ("content", "reasoning")
    if isinstance(item, list) and len(item) == 2 and isinstance(item[1], str):
        for channel in channels:
            if item[0] == channel:
                return Piece(channel, item[1])
    raise bad_request("'sim.chunks' items must be strings or [channel, text] pairs", "sim")
