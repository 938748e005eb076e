"""The configuration page of the docs (``docs/configuration.md``), rendered from ``Settings``:
each setting's variable, default and description (its attribute docstring), grouped by the
``# --- section`` lines of ``gateway/settings.py``, so the page cannot say other than the code
does. A test compares the two; ``python -m tools.settingsdoc > docs/configuration.md`` writes it
again (``make docs`` does)."""

from __future__ import annotations

import enum
import inspect
import re
from pathlib import Path
from typing import Any

from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from gateway.settings import Settings

INTRO = """\
# Configuration

Generated from `gateway/settings.py` by `python -m tools.settingsdoc > docs/configuration.md`
(`make docs`); a test holds this page to the code.

Every setting is an environment variable with the prefix `THINKGATE_` (`THINKGATE_UPSTREAMS`),
or the same name in lower case in a YAML file named by `THINKGATE_CONFIG`. Precedence: the
command line > the environment > the YAML file > the defaults below. A value that cannot be used
stops `thinkgate serve` with one line naming the setting (exit 2).
"""

OUTRO = """
## Per-model settings

Per-model reasoning settings live in the YAML file (an unknown name or an impossible format
stops the start with one line naming the model and the known formats):

```yaml
upstreams: [http://vllm-r1:8000/v1, http://vllm-qwen:8000/v1, http://vllm-k3:8000/v1]
reasoning_parser: deepseek_r1
reasoning_source: upstream                  # the R1 engine runs --reasoning-parser deepseek_r1
models:
  qwen3-235b: {reasoning_parser: qwen3}      # its engine runs none: thinkgate splits the text
  kimi-k3: {reasoning_parser: kimi_k3, reasoning_source: text}
  qwq-32b: {reasoning_parser: think_tags, reasoning_source: text}
  my-model: {reasoning_source: text, reasoning_format: {open: "<reason>", close: "</reason>"}}
  deepseek-r1: {effort_budgets: {low: 2048, high: 32768}, effort_enforcement: gateway}
```

Tenants' and keys' policies (limits, fair-share weight, priority, a reasoning ceiling) too:

```yaml
tenants:
  acme: {rpm: 600, tpm: 2000000, weight: 3, priority: standard}
keys:
  3f2a9c0b1d4e: {priority: critical, max_reasoning_tokens: 8192}
```
"""

_SECTION = re.compile(r"^    # --- (?P<title>.+)$")
_FIELD = re.compile(r"^    (?P<name>[a-z][a-z0-9_]*):")


def sections() -> list[tuple[str, list[str]]]:
    """``(title, field names)`` in the order of ``gateway/settings.py``."""
    source = inspect.getsource(Settings)
    found: list[tuple[str, list[str]]] = []
    for line in source.splitlines():
        if match := _SECTION.match(line):
            found.append((match["title"], []))
        elif (match := _FIELD.match(line)) and match["name"] in Settings.model_fields:
            found[-1][1].append(match["name"])
    return found


def variable(name: str, field: FieldInfo) -> str:
    alias = field.validation_alias
    return alias if isinstance(alias, str) else f"THINKGATE_{name.upper()}"


def default(field: FieldInfo) -> str:
    value: Any = field.default
    if value is PydanticUndefined and field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
    if value is None:
        return "unset"
    if hasattr(value, "get_secret_value"):
        value = value.get_secret_value()
    if isinstance(value, enum.Enum):
        value = value.value
    if value in ("", (), {}) and not isinstance(value, bool | int | float):
        return "empty"
    if isinstance(value, dict):
        return "`" + ", ".join(f"{k}: {v}" for k, v in value.items()) + "`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, Path):
        value = str(value) if str(value).startswith(("/", ".")) else f"./{value}"
    return f"`{value}`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def document() -> str:
    """The whole page."""
    fields = Settings.model_fields
    parts = [INTRO]
    for title, names in sections():
        rows = [f"| `{variable(n, fields[n])}` | {default(fields[n])} | "
                f"{_cell(fields[n].description or '')} |" for n in names]  # fmt: skip
        parts.append(f"\n## {title[0].upper()}{title[1:]}\n\n| variable | default | meaning |\n"
                     "|---|---|---|\n" + "\n".join(rows) + "\n")  # fmt: skip
    parts.append(OUTRO)
    return "".join(parts)


if __name__ == "__main__":
    print(document(), end="")
