"""Guardrail policies from the YAML file ``GUARDRAILS_FILE`` names, and which apply to a request.

```yaml
policies:
  - name: pii
    tenants: ["*"]              # or a list of tenants
    models: ["*"]               # or a list of model names (shell-style patterns allowed)
    detect: [email, phone, credit_card, iban, us_ssn, secret_key,
             {regex: "ACME-[0-9]{6}", label: "[ACME_ID]", max_length: 64},
             {phone: {region: GB}}]
    scope: [reasoning, answer]  # and/or prompt
    action: redact              # redact | block | flag
    targets: [client, ledger]   # where a redaction applies
```

A file that cannot be used is refused with the line and the field (``PolicyFileError``):
``thinkgate serve`` exits 2 before it listens. Kept deliberately out of this version, and
refused by name rather than ignored: guard-model detectors (``{model: ...}``), so that a
policy never silently does less than its file says.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gateway.guard.detectors import BUILTIN, Detector, PatternError, builtin, custom

Action = Literal["redact", "block", "flag"]
Channel = Literal["reasoning", "answer", "prompt"]


class PolicyFileError(ValueError):
    """The policy file cannot be used; the message names the line and the field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _RegexSpec(_Strict):
    regex: str
    label: str = "[REDACTED]"
    max_length: int = Field(256, ge=1, le=4096)


class _PhoneOptions(_Strict):
    region: str = Field("US", pattern=r"^[A-Z]{2}$")


class _PhoneSpec(_Strict):
    phone: _PhoneOptions


class _PolicySpec(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    tenants: tuple[str, ...] = ("*",)
    models: tuple[str, ...] = ("*",)
    detect: tuple[str | _RegexSpec | _PhoneSpec, ...] = Field(min_length=1)
    scope: tuple[Literal["reasoning", "answer", "prompt"], ...] = ("reasoning", "answer")
    action: Action
    targets: tuple[Literal["client", "ledger"], ...] = ("client", "ledger")
    on_error: Literal["allow", "block"] | None = None

    @field_validator("detect", mode="before")
    @classmethod
    def _known(cls, value: Any) -> Any:
        for item in value if isinstance(value, list) else ():
            if isinstance(item, str) and item not in BUILTIN:
                raise ValueError(f"unknown detector {item!r} (one of {', '.join(BUILTIN)}, "
                                 "{regex: ...} or {phone: {region: XX}})")  # fmt: skip
            if isinstance(item, dict) and "model" in item:
                raise ValueError("guard-model detectors ({model: ...}) are not supported in "
                                 "this version")  # fmt: skip
        return value

    @field_validator("scope")
    @classmethod
    def _channels(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise ValueError("at least one of reasoning, answer, prompt")
        return value


class _FileSpec(_Strict):
    policies: tuple[_PolicySpec, ...]

    @field_validator("policies")
    @classmethod
    def _unique(cls, value: tuple[_PolicySpec, ...]) -> tuple[_PolicySpec, ...]:
        names = [p.name for p in value]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"policy names must be unique: {', '.join(twice)}")
        return value


@dataclass(frozen=True, slots=True)
class GuardPolicy:
    name: str
    tenants: tuple[str, ...]
    models: tuple[str, ...]
    detectors: tuple[Detector, ...]
    channels: frozenset[Channel]
    action: Action
    targets: frozenset[Literal["client", "ledger"]]

    def applies(self, tenant: str, model: str) -> bool:
        return ("*" in self.tenants or tenant in self.tenants) and any(
            fnmatch.fnmatchcase(model, pattern) for pattern in self.models
        )


@dataclass(frozen=True, slots=True)
class Guardrails:
    policies: tuple[GuardPolicy, ...] = ()

    def select(self, tenant: str, model: str) -> tuple[GuardPolicy, ...]:
        """The policies that apply to a request of ``tenant`` for ``model``, in file order."""
        return tuple(p for p in self.policies if p.applies(tenant, model))


NONE = Guardrails()


def load(path: Path) -> Guardrails:
    """The policies in ``path``; ``PolicyFileError`` naming the line and field otherwise."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise PolicyFileError(f"{path}: cannot be read ({exc.strerror})") from None
    return parse(text, str(path))


def parse(text: str, source: str = "<guardrails>") -> Guardrails:
    try:
        node = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise PolicyFileError(f"{source}:{where} is not valid YAML") from None
    try:
        spec = _FileSpec.model_validate(data)
    except ValidationError as exc:
        error = exc.errors(include_url=False, include_input=False)[0]
        loc = tuple(error["loc"])
        field = ".".join(str(part) for part in loc) or "(top level)"
        raise PolicyFileError(f"{source}: line {_line(node, loc)}, {field}: {error['msg']}"
                              ) from None  # fmt: skip
    return Guardrails(tuple(_policy(p, source, node, i) for i, p in enumerate(spec.policies)))


def _policy(spec: _PolicySpec, source: str, node: Any, index: int) -> GuardPolicy:
    detectors: list[Detector] = []
    for position, item in enumerate(spec.detect):
        if isinstance(item, str):
            detectors.append(builtin(item))
        elif isinstance(item, _PhoneSpec):
            detectors.append(builtin("phone", region=item.phone.region))
        else:
            try:
                detectors.append(custom(item.regex, label=item.label, max_length=item.max_length))
            except PatternError as exc:
                loc = ("policies", index, "detect", position, "regex")
                raise PolicyFileError(f"{source}: line {_line(node, loc)}, "
                                      f"{'.'.join(map(str, loc))}: {exc}") from None  # fmt: skip
    channels: frozenset[Channel] = frozenset(spec.scope)
    return GuardPolicy(spec.name, spec.tenants, spec.models, tuple(detectors), channels,
                       spec.action, frozenset(spec.targets))  # fmt: skip


def _line(node: Any, loc: Sequence[object]) -> int:
    """The 1-based line of the YAML node at ``loc`` (as deep as the file goes)."""
    here = node
    for part in loc:
        if isinstance(here, yaml.MappingNode):
            match = [v for k, v in here.value if k.value == part]
            if not match:
                break
            here = match[0]
        elif isinstance(here, yaml.SequenceNode) and isinstance(part, int):
            if part >= len(here.value):
                break
            here = here.value[part]
        else:
            break
    return int(here.start_mark.line) + 1 if here is not None else 1
