"""Several benchmarks share ``bench/RESULTS.md``: each owns a section between markers
``<!-- NAME:begin -->`` and ``<!-- NAME:end -->`` and rewrites only that one; the relay
comparison, which writes the whole file, carries the marked sections of the old file over.
Also what every section states first: the code measured and the machine."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Sequence
from pathlib import Path

_BLOCK = re.compile(r"<!-- (\w+):begin -->.*?<!-- \1:end -->\n?", re.DOTALL)


def block(name: str, body: str) -> str:
    return f"<!-- {name}:begin -->\n{body.rstrip()}\n<!-- {name}:end -->\n"


def write_section(path: Path, name: str, body: str) -> None:
    """Replace the section ``name`` of ``path`` (or append it)."""
    text = path.read_text() if path.exists() else ""
    new = block(name, body)
    pattern = re.compile(rf"<!-- {name}:begin -->.*?<!-- {name}:end -->\n?", re.DOTALL)
    if pattern.search(text):
        text = pattern.sub(lambda _: new, text)
    else:
        text = text.rstrip() + "\n\n" + new if text else new
    path.write_text(text)


def carry_sections(old: str, new: str) -> str:
    """``new`` plus every marked section of ``old`` that ``new`` lacks."""
    kept = [m.group(0) for m in _BLOCK.finditer(old) if f"<!-- {m.group(1)}:begin -->" not in new]
    return new.rstrip() + "\n\n" + "\n".join(kept) if kept else new


def revision(paths: Sequence[str]) -> str:
    """The measured code: git's short commit, marked when ``paths`` differ from it."""
    root = Path(__file__).resolve().parent.parent
    git = ["git", "-C", str(root)]
    try:
        head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True)
        dirty = subprocess.run([*git, "status", "--porcelain", "--", *paths], capture_output=True)
    except OSError:
        return "unknown revision"
    commit = head.stdout.decode().strip() or "unknown revision"
    changed = ", ".join(paths)
    return commit + (f" with uncommitted changes in {changed}" if dirty.stdout.strip() else "")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return "unknown CPU"
