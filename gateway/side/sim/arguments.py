"""A tool call's arguments, sampled from the tool's parameters schema (sans-I/O).

``sample_arguments(schema, hints) -> dict[str, Any]``: an object valid against ``schema`` for
the JSON Schema that tool definitions use (OpenAI ``parameters``, Anthropic ``input_schema``,
pydantic's output with ``$defs``).

Rules:

- The object has the schema's required properties, each sampled from its own schema; optional
  ones are left out (a model calls with what it needs). A required property the schema does
  not declare is ``null`` (any value is valid).
- A required property named in ``hints`` (``gateway.side.sim.fit.hints_for``: ``command``,
  ``cmd``, ``pattern``, ``url``, ``query``) takes the hint where its schema accepts a string;
  an array takes it split as a shell would (``"ls -la"`` → ``["ls", "-la"]``), or, if it has
  shell syntax (a glob, a pipe), as ``["bash", "-lc", hint]``, as models call Codex's shell.
- Sampling one schema: its ``const``; else the first of its ``enum``; a local ``$ref``
  (``#``, ``#/$defs/X``, ``#/definitions/X``) is followed first; a combinator is folded into the
  schema (``allOf``: every part; ``anyOf`` / ``oneOf``: the first alternative that is not
  ``null``; the schema's own keywords win); else by ``type`` (of a list of types, the first
  that is not ``"null"``):

  ``string``   ``"sim"``, lengthened to ``minLength`` and cut to ``maxLength``; formats
               ``uri``/``url`` → ``https://example.com``, ``email``, ``date``, ``date-time``,
               ``uuid`` → a valid example
  ``integer``  ``number``: ``1``, moved inside ``minimum``/``maximum`` (and the exclusive bounds)
  ``boolean``  ``true``; ``null``: ``null``
  ``object``   its required properties, as above
  ``array``    ``minItems`` items, at least one when ``items`` is a schema, at most ``maxItems``
  no type      an object if it has ``properties``, an array if ``items``, else ``null``

- Nesting deeper than eight levels (a recursive ``$ref``) samples ``null``.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any, TypeGuard

__all__ = ["sample_arguments"]

_MAX_DEPTH = 8
_SHELL_SYNTAX = frozenset("*?|&;<>$`")
_FORMATS = {
    "uri": "https://example.com", "url": "https://example.com", "email": "sim@example.com",
    "date": "2025-01-01", "date-time": "2025-01-01T00:00:00Z",
    "uuid": "00000000-0000-4000-8000-000000000000",
}  # fmt: skip


def sample_arguments(schema: Mapping[str, Any], hints: Mapping[str, str]) -> dict[str, Any]:
    """Arguments valid against ``schema`` (rules in the module docstring)."""
    return _Sampler(schema, hints).properties(schema, 0)


class _Sampler:
    """Samples the schemas of one tool, resolving references against its root schema."""

    def __init__(self, root: Mapping[str, Any], hints: Mapping[str, str]) -> None:
        self._root = root
        self._hints = hints

    def properties(self, schema: Mapping[str, Any], depth: int) -> dict[str, Any]:
        properties = schema.get("properties")
        declared = properties if isinstance(properties, dict) else {}
        required = schema.get("required")
        names = [n for n in required if isinstance(n, str)] if isinstance(required, list) else []
        return {name: self._property(name, declared.get(name), depth + 1) for name in names}

    def _property(self, name: str, spec: object, depth: int) -> Any:
        if not isinstance(spec, dict):
            return None
        hint = self._hints.get(name)
        hinted = _hinted(self._resolve(spec, depth), hint) if hint is not None else None
        return hinted if hinted is not None else self.sample(spec, depth)

    def sample(self, schema: Mapping[str, Any], depth: int) -> Any:
        if depth > _MAX_DEPTH:
            return None
        schema = self._resolve(schema, depth)
        enum = schema.get("enum")
        if "const" in schema:
            return schema["const"]
        if isinstance(enum, list) and enum:
            return enum[0]
        combined = _combined(schema)
        if combined is not None:
            return self.sample(combined, depth + 1)
        kind = _kind(schema)
        if kind == "object":
            return self.properties(schema, depth)
        if kind == "array":
            return self._array(schema, depth)
        return _scalar(kind, schema)

    def _array(self, schema: Mapping[str, Any], depth: int) -> list[Any]:
        items = schema.get("items")
        count = _count(schema.get("minItems"), 1 if isinstance(items, dict) else 0)
        limit = schema.get("maxItems")
        if isinstance(limit, int) and not isinstance(limit, bool):
            count = min(count, limit)
        item = items if isinstance(items, dict) else {}
        return [self.sample(item, depth + 1) for _ in range(count)]

    def _resolve(self, schema: Mapping[str, Any], depth: int) -> Mapping[str, Any]:
        """``schema`` with its local ``$ref`` followed (an unknown one: any value)."""
        while isinstance(schema.get("$ref"), str) and depth <= _MAX_DEPTH:
            schema, depth = _lookup(self._root, schema["$ref"]), depth + 1
        return schema


def _lookup(root: Mapping[str, Any], ref: str) -> Mapping[str, Any]:
    node: Any = root
    if ref == "#":
        return root
    if not ref.startswith("#/"):
        return {}
    for key in ref[2:].split("/"):
        node = node.get(key.replace("~1", "/").replace("~0", "~")) if isinstance(node, dict) \
            else None  # fmt: skip
    return node if isinstance(node, dict) else {}


def _combined(schema: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """``schema`` with its first combinator folded in (``allOf``: every part; ``anyOf`` /
    ``oneOf``: the first that is not ``null``), its own keywords winning; ``None`` if it has
    none."""
    for key in ("allOf", "anyOf", "oneOf"):
        options = schema.get(key)
        if not isinstance(options, list):
            continue
        parts = [o for o in options if isinstance(o, dict)]
        if key != "allOf":
            usable = [o for o in parts if o.get("type") != "null"]
            parts = usable[:1] or [{"type": "null"}]
        folded: dict[str, Any] = {}
        for part in parts:
            folded.update(part)
        folded.update((k, v) for k, v in schema.items() if k != key)
        return folded
    return None


def _kind(schema: Mapping[str, Any]) -> str | None:
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if isinstance(kind, str):
        return kind
    if isinstance(schema.get("properties"), dict):
        return "object"
    return "array" if "items" in schema else None


def _scalar(kind: str | None, schema: Mapping[str, Any]) -> Any:
    if kind == "string":
        return _string(schema)
    if kind in ("integer", "number"):
        return _number(schema, kind == "integer")
    return True if kind == "boolean" else None


def _string(schema: Mapping[str, Any]) -> str:
    fmt = schema.get("format")
    text = _FORMATS.get(fmt, "sim") if isinstance(fmt, str) else "sim"
    shortest = _count(schema.get("minLength"), 0)
    text = text.ljust(shortest, "m")
    longest = schema.get("maxLength")
    if isinstance(longest, int) and not isinstance(longest, bool):
        text = text[: max(longest, 0)]
    return text


def _number(schema: Mapping[str, Any], integer: bool) -> int | float:
    """1, moved inside the bounds (an exclusive bound by one unit)."""
    value: int | float = 1
    step = 1
    low, high = schema.get("minimum"), schema.get("maximum")
    low_x, high_x = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    if _is_number(low) and value < low:
        value = low
    if _is_number(low_x) and value <= low_x:
        value = low_x + step
    if _is_number(high) and value > high:
        value = high
    if _is_number(high_x) and value >= high_x:
        value = high_x - step
    return int(value) if integer and float(value).is_integer() else value


def _is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _count(value: object, default: int) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return max(value, default)
    return default


def _hinted(spec: Mapping[str, Any], hint: str) -> Any:
    """The hint as ``spec`` takes it: a string, or an array of shell words; else ``None``."""
    kind = _kind(spec)
    if kind in ("string", None) and "enum" not in spec and "const" not in spec:
        return hint
    items = spec.get("items")
    if kind == "array" and (not isinstance(items, dict) or _kind(items) in ("string", None)):
        if _SHELL_SYNTAX & set(hint):  # a glob or a pipe needs a shell to mean anything
            return ["bash", "-lc", hint]
        try:
            return shlex.split(hint)
        except ValueError:  # unbalanced quotes: split at spaces
            return hint.split()
    return None
