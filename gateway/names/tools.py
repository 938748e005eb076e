"""The engine's function names mapped back to the client's tools (sans-I/O): a namespace's
tools and custom tools go to the engine as flat functions (``gateway.api.tools``), and a call
goes out as the client named it (``gateway.relay.apis.response_items``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

ToolKind = Literal["function", "custom"]


@dataclass(frozen=True, slots=True)
class ClientTool:
    """A tool as the client named it."""

    name: str
    namespace: str | None = None
    kind: ToolKind = "function"


@dataclass(frozen=True, slots=True)
class ToolMap:
    """The engine's function names, each mapped back to the client's tool."""

    tools: Mapping[str, ClientTool] = field(default_factory=lambda: MappingProxyType({}))

    def client(self, flat: str) -> ClientTool:
        return self.tools.get(flat) or ClientTool(flat)
