"""The OCSF schema for API Activity (class 6003), as JSON Schema from the ``ocsf-json-schema``
package (OCSF's own exports, every release from 1.0 on), and a check of events against it."""

from __future__ import annotations

import functools
from typing import Any

from jsonschema import Draft202012Validator
from ocsf_json_schema import OcsfJsonSchemaEmbedded, get_ocsf_schema, get_packaged_versions

from gateway.side.siem.ocsf import CLASS_UID, OCSF_VERSION


def releases() -> list[str]:
    """The packaged OCSF releases from the one the events claim on (no release candidates)."""
    claimed = _key(OCSF_VERSION)
    found = [v for v in get_packaged_versions() if "-" not in v and _key(v) >= claimed]
    return sorted(found, key=_key)


@functools.cache
def validator(version: str = OCSF_VERSION) -> Draft202012Validator:
    schema = OcsfJsonSchemaEmbedded(get_ocsf_schema(version=version))
    name = schema.lookup_class_name_from_uid(CLASS_UID)
    return Draft202012Validator(schema.get_class_schema(name))


def schema_errors(event: dict[str, Any], version: str = OCSF_VERSION) -> list[str]:
    """Every way ``event`` breaks the class schema of ``version`` (empty: valid)."""
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
            for e in validator(version).iter_errors(event)]  # fmt: skip


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("-")[0].split("."))
