"""The field-policy page of the docs (``docs/fields.md``), rendered from the tables of
``gateway.api.fields`` so the page can never say other than the code does; a test compares the
two, and ``python -m tools.fieldsdoc > docs/fields.md`` writes it again."""

from __future__ import annotations

from gateway.api.fields import TABLES, markdown_table

INTRO = """\
# Request fields, API by API

Generated from `gateway/api/fields.py` by `python -m tools.fieldsdoc > docs/fields.md`;
`tests/gateway/api/test_fields.py` holds the parsers to every row, and this page to the code.

Every top-level request field of each endpoint's current reference (and vLLM's own fields, and
those known clients send beyond the reference) has one policy:

- **honoured**: the gateway or the engine does what the reference says;
- **mapped**: turned into the engine's nearest equivalent (named after the arrow);
- **ignored**: accepted, without effect on a self-hosted engine, never sent to it;
- **refused**: a 400 naming the field, only where dropping it would silently change the answer;
  `null` and the values listed ask for nothing and are accepted.

A field no row names follows `UNKNOWN_FIELDS`: `ignore` (the default) accepts it, counts it in
`thinkgate_unknown_fields_total`, logs its name once and names it in the response's
`x-thinkgate-ignored` header (on chat, completions and embeddings it is also sent on, as vLLM's
extras always were; on Responses and Messages it is dropped); `refuse` answers 400 naming it.
"""


def document() -> str:
    """The whole page."""
    parts = [INTRO]
    for path, table in TABLES.items():
        parts.append(f"\n## `POST {path}`\n\n{markdown_table(table)}")
    return "".join(parts)


if __name__ == "__main__":
    print(document(), end="")
