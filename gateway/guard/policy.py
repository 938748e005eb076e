"""Guardrail policies from the YAML file ``GUARDRAILS_FILE`` names, and which apply to a request.

```yaml
policies:
  - name: pii
    tenants: ["*"]              # or a list of tenants
    models: ["*"]               # or a list of model names (shell-style patterns allowed)
    detect: [email, phone, credit_card, iban, us_ssn, secret_key,
             {regex: "ACME-[0-9]{6}", label: "[ACME_ID]", max_length: 64},
             {phone: {regions: [GB, DE]}}, {us_ssn: {bare: true}}]
    scope: [reasoning, answer]  # and/or prompt
    action: redact              # redact | block | flag
    targets: [client, ledger]   # where a redaction applies
```

A guard model (``gateway.guard.judging``) is a detector too: an OpenAI-compatible chat
endpoint that answers as Llama Guard does (``safe``, or ``unsafe`` and its categories)::

    detect: [{model: llama-guard, upstream: "http://guard.models:8000/v1",
              categories: [S1, S9],       # the categories that count (default: every one)
              every: sentence,            # or paragraph: when a stream's text is asked
              window: 4000,               # the most characters of a channel one ask carries
              timeout_s: 5,
              params: {temperature: 0}}]  # merged into the guard request's body
    on_error: block                       # allow | block: a guard model that cannot answer

A guard model judges text; it finds no span to replace, so its policy's action is ``block``
or ``flag`` (``redact`` is refused). ``on_error`` defaults to ``block`` for a ``block``
policy and to ``allow`` for a ``flag`` one.

A file that cannot be used is refused with the line and the field (``PolicyFileError``):
``thinkgate serve`` exits 2 before it listens.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import httpx
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)

if TYPE_CHECKING:  # the detectors (and ``regex``) load with a policy that names them
    from gateway.guard.detectors import Detector

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


_Region = Annotated[str, Field(pattern=r"^[A-Z]{2}$")]


class _PhoneOptions(_Strict):
    region: _Region | None = None  # one region (the older form)
    regions: tuple[_Region, ...] = ()  # a national number valid in any of them is one

    @model_validator(mode="after")
    def _known_regions(self) -> _PhoneOptions:
        import phonenumbers  # a policy that names phone numbers: the detector loads it anyway

        for region in self.all():
            if region not in phonenumbers.SUPPORTED_REGIONS:
                raise ValueError(f"{region!r} is not a region libphonenumber knows")
        return self

    def all(self) -> tuple[str, ...]:
        found = (*((self.region,) if self.region else ()), *self.regions)
        return tuple(dict.fromkeys(found)) or ("US",)


class _PhoneSpec(_Strict):
    phone: _PhoneOptions


class _SecretOptions(_Strict):
    rules: tuple[str, ...] = Field(min_length=1)  # "builtin" (the shapes here) or a rule's name

    @field_validator("rules")
    @classmethod
    def _known_rules(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        from gateway.guard.secrets import secret_rules

        known = ("builtin", *secret_rules())
        for name in value:
            if name not in known:
                raise ValueError(f"unknown secret rule {name!r} (one of {', '.join(known)})")
        return value


class _SecretSpec(_Strict):
    secret_key: _SecretOptions


class _SsnOptions(_Strict):
    bare: bool = False  # nine bare digits after a context word ("SSN: 078051120") count too


class _SsnSpec(_Strict):
    us_ssn: _SsnOptions


class _ModelSpec(_Strict):
    model: str = Field(min_length=1, max_length=256)
    upstream: str = Field(pattern=r"^https?://[^\s]+$")
    categories: tuple[str, ...] = ()
    every: Literal["sentence", "paragraph"] = "sentence"
    window: int = Field(4000, ge=200, le=100_000)
    timeout_s: float = Field(5.0, gt=0, le=120)
    params: dict[str, Any] = Field(default_factory=dict)

    @field_validator("upstream")
    @classmethod
    def _url(cls, value: str) -> str:
        try:
            url = httpx.URL(value)
            url.port  # noqa: B018  # a port that is not a number raises here
        except (httpx.InvalidURL, ValueError):
            raise ValueError(f"not a URL: {value!r}") from None
        if not url.host:
            raise ValueError(f"not a URL with a host: {value!r}")
        return value

    @field_validator("params")
    @classmethod
    def _own(cls, value: dict[str, Any]) -> dict[str, Any]:
        taken = sorted(set(value) & {"model", "messages", "stream"})
        if taken:
            raise ValueError(f"params may not set {', '.join(taken)}: the gateway does")
        return value


def _kind(item: Any) -> str | None:
    """Which detector an item of ``detect`` is: a built-in's name, or the key of its mapping
    (so that an error names the field of the kind it is, not of the first kind tried)."""
    if isinstance(item, str):
        return "name"
    if isinstance(item, dict):
        kinds = ("model", "regex", "phone", "us_ssn", "secret_key")
        return next((k for k in kinds if k in item), "regex")
    return None


_Detect = Annotated[
    Annotated[str, Tag("name")] | Annotated[_RegexSpec, Tag("regex")]
    | Annotated[_PhoneSpec, Tag("phone")] | Annotated[_SsnSpec, Tag("us_ssn")]
    | Annotated[_SecretSpec, Tag("secret_key")] | Annotated[_ModelSpec, Tag("model")],
    Discriminator(_kind, custom_error_type="detector",
                  custom_error_message="a detector is a name or a mapping ({regex: ...}, "
                                       "{phone: ...}, {us_ssn: ...}, {secret_key: ...} or "
                                       "{model: ...})"),
]  # fmt: skip


class _PolicySpec(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    tenants: tuple[str, ...] = ("*",)
    models: tuple[str, ...] = ("*",)
    detect: tuple[_Detect, ...] = Field(min_length=1)
    scope: tuple[Literal["reasoning", "answer", "prompt"], ...] = ("reasoning", "answer")
    action: Action
    targets: tuple[Literal["client", "ledger"], ...] = ("client", "ledger")
    on_error: Literal["allow", "block"] | None = None

    @field_validator("detect", mode="before")
    @classmethod
    def _known(cls, value: Any) -> Any:
        builtin = _builtin_names()
        for item in value if isinstance(value, list) else ():
            if isinstance(item, str) and item not in (*builtin, "secret_rules"):
                raise ValueError(f"unknown detector {item!r} (one of {', '.join(builtin)}, "
                                 "secret_rules, {secret_key: {rules: [...]}}, "
                                 "{regex: ...}, {phone: {regions: [XX, ...]}}, "
                                 "{us_ssn: {bare: true}} or "
                                 "{model: ...})")  # fmt: skip
        return value

    @model_validator(mode="after")
    def _judged(self) -> _PolicySpec:
        if self.action == "redact" and any(isinstance(d, _ModelSpec) for d in self.detect):
            raise ValueError("a guard model ({model: ...}) finds no span to redact: its "
                             "policy's action must be block or flag")  # fmt: skip
        return self

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
class GuardModel:
    """A guard model a policy asks (``gateway.guard.judging``)."""

    model: str
    upstream: str  # an OpenAI-compatible base URL (``…/v1``)
    categories: frozenset[str]  # the categories that count; empty: every one
    every: Literal["sentence", "paragraph"]
    window: int
    timeout_s: float
    params: tuple[tuple[str, Any], ...]  # merged into the request body

    @property
    def name(self) -> str:
        """The detector's name in acts and records."""
        return f"model:{self.model}"


@dataclass(frozen=True, slots=True)
class GuardPolicy:
    name: str
    tenants: tuple[str, ...]
    models: tuple[str, ...]
    detectors: tuple[Detector, ...]
    channels: frozenset[Channel]
    action: Action
    targets: frozenset[Literal["client", "ledger"]]
    judges: tuple[GuardModel, ...] = ()
    on_error: Literal["allow", "block"] = "block"

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
    import yaml  # only with a guardrail policy

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
        loc = _untagged(tuple(error["loc"]))
        field = ".".join(str(part) for part in loc) or "(top level)"
        raise PolicyFileError(f"{source}: line {_line(node, loc)}, {field}: {error['msg']}"
                              ) from None  # fmt: skip
    return Guardrails(tuple(_policy(p, source, node, i) for i, p in enumerate(spec.policies)))


def _builtin_names() -> tuple[str, ...]:
    from gateway.guard.detectors import BUILTIN

    return tuple(BUILTIN)


def _policy(spec: _PolicySpec, source: str, node: Any, index: int) -> GuardPolicy:
    from gateway.guard.detectors import PatternError, builtin, custom
    from gateway.guard.secrets import secret_rules

    detectors: list[Detector] = []
    judges: list[GuardModel] = []
    for position, item in enumerate(spec.detect):
        if isinstance(item, _ModelSpec):
            judges.append(GuardModel(item.model, item.upstream.rstrip("/"),
                                     frozenset(item.categories), item.every, item.window,
                                     item.timeout_s, tuple(item.params.items())))  # fmt: skip
        elif item == "secret_rules":  # the maintained rule set's rules, every one
            detectors += secret_rules().values()
        elif isinstance(item, str):
            detectors.append(builtin(item))
        elif isinstance(item, _SecretSpec):
            rules = secret_rules()
            detectors += [builtin("secret_key") if name == "builtin" else rules[name]
                          for name in item.secret_key.rules]  # fmt: skip
        elif isinstance(item, _PhoneSpec):
            detectors.append(builtin("phone", regions=item.phone.all()))
        elif isinstance(item, _SsnSpec):
            detectors.append(builtin("us_ssn", bare=item.us_ssn.bare))
        else:
            try:
                detectors.append(custom(item.regex, label=item.label, max_length=item.max_length))
            except PatternError as exc:
                loc = ("policies", index, "detect", position, "regex")
                raise PolicyFileError(f"{source}: line {_line(node, loc)}, "
                                      f"{'.'.join(map(str, loc))}: {exc}") from None  # fmt: skip
    channels: frozenset[Channel] = frozenset(spec.scope)
    on_error = spec.on_error or ("block" if spec.action == "block" else "allow")
    return GuardPolicy(spec.name, spec.tenants, spec.models, tuple(detectors), channels,
                       spec.action, frozenset(spec.targets), tuple(judges), on_error)  # fmt: skip


def _untagged(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """``loc`` without the detector kind pydantic puts after ``detect.N`` (not a key)."""
    return tuple(part for i, part in enumerate(loc)
                 if not (i >= 2 and loc[i - 2] == "detect" and part in _KINDS))  # fmt: skip


_KINDS = ("name", "regex", "phone", "model")


def _line(node: Any, loc: Sequence[object]) -> int:
    """The 1-based line of the YAML node at ``loc`` (as deep as the file goes)."""
    import yaml  # loaded by ``parse``, which read the file

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
