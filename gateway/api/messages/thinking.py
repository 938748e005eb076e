"""A Messages request's ``thinking``, ``output_config`` and ``output_format``, as the chat fields
the reasoning budget and structured outputs read (sans-I/O).

``thinking(raw, max_tokens, chat) -> Thinking`` and ``output(config, legacy, chat)`` put their
fields in the chat body being built and say which thinking blocks the answer is to carry.

- ``thinking``: ``{"type": "enabled", "budget_tokens": N}`` (N below ``max_tokens``, as the
  reference requires) is the request's reasoning budget (``thinking_token_budget``,
  ``gateway.relay.effort``); ``{"type": "disabled"}`` is ``reasoning_effort: "none"`` (thinking
  off where the format can, else a budget of 0); ``adaptive`` and ``between_tools`` set no
  budget of their own (the model thinks as its format does; Anthropic's ``between_tools``, no
  thinking but progress notes between tool calls, has no engine equivalent, and is served as
  ``adaptive``). Thinking blocks are returned only when thinking is enabled, adaptive or
  between tools: a client that did not ask for them reads ``content[0].text``.
- ``thinking.display``: ``summarized`` (or absent) returns thinking as the key may see it;
  ``omitted`` returns each thinking block with its ``signature`` and empty ``thinking`` text,
  for any key (the signature seals the reasoning for the next turn, as Anthropic's does), so
  no reasoning text leaves for that request whatever the key.
- ``output_config.effort`` (``low``, ``medium``, ``high``, ``xhigh``, ``max``: anthropic-sdk
  2.15's ``OutputConfigParam``) is ``reasoning_effort``, whose budget ``gateway.relay.effort``
  sets as for chat; with ``thinking.budget_tokens`` too, the smaller budget holds; with thinking
  disabled, thinking stays off. ``output_config.format`` (``{"type": "json_schema", "schema"}``)
  is ``response_format`` ``json_schema`` (the engine's structured outputs), as is the older
  top-level ``output_format`` when ``output_config.format`` is absent. ``task_budget`` is
  accepted without effect: a budget across contexts the client keeps itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.errors import InvalidRequest

EFFORTS = ("low", "medium", "high", "xhigh", "max")
_THINKING = ("enabled", "disabled", "adaptive", "between_tools")
_DISPLAY = (None, "summarized", "omitted")
SCHEMA_NAME = "output"  # response_format.json_schema needs a name; Anthropic's format has none


@dataclass(frozen=True, slots=True)
class Thinking:
    """Which thinking blocks the answer carries."""

    show: bool = False  # thinking blocks are returned
    omit: bool = False  # display omitted: the blocks carry their signature, no text


def thinking(raw: Any, max_tokens: int, chat: dict[str, Any]) -> Thinking:
    """Put the thinking setting in ``chat``; the blocks the answer is to carry."""
    if raw is None:
        return Thinking()
    kind = raw.get("type") if isinstance(raw, dict) else None
    if kind not in _THINKING:
        raise InvalidRequest(f"thinking.type: one of {', '.join(_THINKING)}",
                             param="thinking.type")  # fmt: skip
    assert isinstance(raw, dict)
    display = raw.get("display")
    if display not in _DISPLAY:
        raise InvalidRequest("thinking.display: one of summarized, omitted",
                             param="thinking.display")  # fmt: skip
    if kind == "disabled":
        chat["reasoning_effort"] = "none"
        return Thinking()
    if kind == "enabled":
        chat["thinking_token_budget"] = _budget(raw.get("budget_tokens"), max_tokens)
    return Thinking(show=True, omit=display == "omitted")


def _budget(budget: Any, max_tokens: int) -> int:
    if type(budget) is not int or not 0 <= budget < max_tokens:
        raise InvalidRequest("thinking.budget_tokens: an integer below max_tokens",
                             param="thinking.budget_tokens")  # fmt: skip
    return budget


def output(config: Any, legacy: Any, chat: dict[str, Any]) -> None:
    """Put ``output_config`` (and the older ``output_format``) in ``chat``."""
    if config is not None and not isinstance(config, dict):
        raise InvalidRequest("output_config: an object", param="output_config")
    config = config or {}
    effort = config.get("effort")
    if effort is not None:
        if effort not in EFFORTS:
            raise InvalidRequest(f"output_config.effort: one of {', '.join(EFFORTS)}",
                                 param="output_config.effort")  # fmt: skip
        if chat.get("reasoning_effort") != "none":  # thinking disabled stays off
            chat["reasoning_effort"] = effort
    fmt = config.get("format")
    if fmt is not None:
        chat["response_format"] = _json_schema(fmt, "output_config.format")
    elif legacy is not None:
        chat["response_format"] = _json_schema(legacy, "output_format")


def _json_schema(fmt: Any, param: str) -> dict[str, Any]:
    """Anthropic's ``{"type": "json_schema", "schema"}`` as chat's ``response_format``."""
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        raise InvalidRequest(f"{param}.type: json_schema", param=f"{param}.type")
    schema = fmt.get("schema")
    if not isinstance(schema, dict):
        raise InvalidRequest(f"{param}.schema: a JSON schema object", param=f"{param}.schema")
    return {"type": "json_schema", "json_schema": {"name": SCHEMA_NAME, "schema": schema}}
