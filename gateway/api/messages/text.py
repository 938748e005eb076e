"""The text of Anthropic content: a message's content and a text block (sans-I/O)."""

from __future__ import annotations

from typing import Any

from gateway.errors import InvalidRequest


def content_of(content: Any, param: str) -> str | list[Any]:
    """A message's content: a string or a list of blocks."""
    if not isinstance(content, str | list):
        raise InvalidRequest(f"{param}: a string or a list of blocks", param=param)
    return content


def text(block: Any, param: str) -> str:
    """A text block's text (its ``cache_control`` and ``citations`` accepted and ignored)."""
    if not isinstance(block, dict) or block.get("type") != "text":
        raise InvalidRequest(f"{param}: a text block", param=param)
    said = block.get("text")
    if not isinstance(said, str):
        raise InvalidRequest(f"{param}.text: Field required", param=f"{param}.text")
    return said
