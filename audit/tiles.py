"""C2SP tlog-tiles: which tile a path names, which stored nodes fill it (sans-I/O).

Spec: https://c2sp.org/tlog-tiles. Tiles have height 8 (256 hashes wide):

* A **hash tile** ``tile/<L>/<N>[.p/<W>]`` holds the hashes of the tree nodes at level ``8·L``
  with indexes ``256·N`` to ``256·N + W - 1``, concatenated (32 bytes each). Full tiles have
  ``W = 256`` and no ``.p/`` suffix; a partial tile of width ``W`` (1 to 255) exists while the
  tree has ``256·N + W`` nodes at that level, exactly. Those nodes are complete subtrees, which
  the ledger stores once each (``audit.merkle``): tiles are read from that table, there is no
  second copy of the tree.
* An **entry bundle** ``tile/entries/<N>[.p/<W>]`` holds entries ``256·N`` to ``256·N + W - 1``,
  each a big-endian uint16 length and the entry, whose leaf hash is ``SHA-256(0x00 || entry)``.
  thinkgate's entry is a record's leaf data ``len(header) (4 bytes) || header || ciphertext``
  (``audit.record``). The format cannot carry an entry over 65,535 bytes: such a record makes
  its bundle unavailable (``EntryTooLarge``), and it is read at ``/audit/v1/records/N/raw``.
* ``N`` is written in groups of three decimal digits, every group but the last prefixed ``x``
  (``1234067`` is ``x001/x234/067``; ``5`` is ``005``). Only the canonical form of a path
  parses: anything else is ``TileError`` (a 404 at the edge, as a file server would answer).
* Whether a tile exists depends on the tree size of the checkpoint served with it (the latest):
  a tile exists once its level has its ``W`` nodes, and then never changes (the first ``W``
  hashes of a tile are the same at every later size). Clients fetch the partial tile of the
  width their checkpoint implies; full tiles are cacheable forever.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterable
from dataclasses import dataclass

from audit.errors import AuditError

HEIGHT = 8
WIDTH = 1 << HEIGHT
MAX_LEVEL = 63
MAX_ENTRY = 0xFFFF
_GROUP = re.compile(r"[0-9]{3}")


class TileError(AuditError, ValueError):
    """The path names no tile (malformed, not canonical, or out of range)."""


class EntryTooLarge(AuditError):
    """An entry of the bundle does not fit the format's uint16 length."""


@dataclass(frozen=True, slots=True)
class TileRef:
    """``level`` is ``None`` for an entry bundle; ``width`` 256 for a full tile."""

    level: int | None
    index: int
    width: int

    @property
    def full(self) -> bool:
        return self.width == WIDTH

    @property
    def start(self) -> int:
        """The first node (or entry) index the tile holds."""
        return self.index * WIDTH

    def nodes_level(self) -> int:
        """The tree level of the hashes a hash tile holds."""
        assert self.level is not None
        return self.level * HEIGHT

    def exists_in(self, tree_size: int) -> bool:
        """Whether a tree of ``tree_size`` leaves has this tile: its level has the ``width``
        nodes (entries) from ``start`` on. A partial tile stays servable after its tile
        grows: its hashes are the first ``width`` of the wider one, which never change."""
        level = 0 if self.level is None else self.nodes_level()
        return (tree_size >> level) - self.start >= self.width


def encode_index(index: int) -> str:
    """``N`` as the spec writes it in a path."""
    if index < 0:
        raise TileError("a tile index is not negative")
    digits = str(index)
    digits = "0" * (-len(digits) % 3) + digits
    groups = [digits[i : i + 3] for i in range(0, len(digits), 3)]
    return "/".join([*(f"x{g}" for g in groups[:-1]), groups[-1]])


def tile_path(ref: TileRef) -> str:
    """The path of ``ref`` below the log's prefix (``tile/0/x001/234.p/7``)."""
    head = "tile/entries" if ref.level is None else f"tile/{ref.level}"
    tail = "" if ref.full else f".p/{ref.width}"
    return f"{head}/{encode_index(ref.index)}{tail}"


def parse_tile_path(rest: str) -> TileRef:
    """The tile named by the path after ``tile/``: ``<L>/<N>[.p/<W>]`` or
    ``entries/<N>[.p/<W>]``, in canonical form only."""
    head, _, tail = rest.partition("/")
    if head == "entries":
        level = None
    elif head.isascii() and head.isdigit() and str(int(head)) == head and int(head) <= MAX_LEVEL:
        level = int(head)
    else:
        raise TileError(f"no tile level {head[:8]!r}")
    width = WIDTH
    if ".p/" in tail:
        tail, _, given = tail.partition(".p/")
        if not (given.isascii() and given.isdigit() and str(int(given)) == given
                and 1 <= int(given) < WIDTH):  # fmt: skip
            raise TileError("a partial tile's width is 1 to 255")
        width = int(given)
    groups = tail.split("/")
    if not all(_GROUP.fullmatch(g.removeprefix("x")) for g in groups) or not all(
        g.startswith("x") for g in groups[:-1]
    ) or groups[-1].startswith("x"):  # fmt: skip
        raise TileError("not a tile index")
    index = int("".join(g.removeprefix("x") for g in groups))
    ref = TileRef(level, index, width)
    if tile_path(ref) != f"tile/{rest}":
        raise TileError("not the canonical path of a tile")
    return ref


def bundle(entries: Iterable[tuple[int, bytes]]) -> bytes:
    """An entry bundle from ``(index, entry)`` pairs."""
    out = bytearray()
    for index, entry in entries:
        if len(entry) > MAX_ENTRY:
            raise EntryTooLarge(
                f"record {index} is {len(entry)} bytes, more than a tlog-tiles entry can hold "
                f"({MAX_ENTRY}); read it at /audit/v1/records/{index}/raw"
            )
        out += struct.pack(">H", len(entry)) + entry
    return bytes(out)
