"""C2SP tlog-tiles paths and entry bundles (``audit.tiles``): the spec's encoding, canonical
paths only, which tiles a tree of a given size has."""

from __future__ import annotations

import pytest

from audit.tiles import (
    EntryTooLarge,
    TileError,
    TileRef,
    bundle,
    encode_index,
    parse_tile_path,
    tile_path,
)


@pytest.mark.parametrize(
    ("index", "path"),
    [
        (0, "000"),
        (5, "005"),
        (999, "999"),
        (1000, "x001/000"),
        (1234067, "x001/x234/067"),
        (2**40, "x001/x099/x511/x627/776"),
    ],
)
def test_indexes_are_written_in_groups_of_three(index: int, path: str) -> None:
    assert encode_index(index) == path
    assert parse_tile_path(f"0/{path}") == TileRef(0, index, 256)


@pytest.mark.parametrize(
    ("rest", "ref"),
    [
        ("0/x001/x234/067", TileRef(0, 1234067, 256)),
        ("3/005.p/7", TileRef(3, 5, 7)),
        ("entries/x001/000.p/255", TileRef(None, 1000, 255)),
        ("63/000", TileRef(63, 0, 256)),
    ],
)
def test_paths_parse_and_print_back(rest: str, ref: TileRef) -> None:
    assert parse_tile_path(rest) == ref
    assert tile_path(ref) == f"tile/{rest}"


@pytest.mark.parametrize(
    "rest",
    [
        "0/5",
        "0/0005",
        "0/x000/005",
        "00/005",
        "64/000",
        "-1/000",
        "0/x005",
        "0/005.p/0",
        "0/005.p/256",
        "0/005.p/07",
        "0/005.p/",
        "entry/000",
        "0/005/",
        "0//005",
        "",
        "0",
        "0/00a",
        "٣/000",
        "0/٠٠٥",
    ],
)
def test_only_canonical_paths_name_a_tile(rest: str) -> None:
    with pytest.raises(TileError):
        parse_tile_path(rest)


def test_which_tiles_a_tree_has() -> None:
    size = 600  # 2 full leaf tiles, then 88 leaves; 2 nodes at level 8
    assert TileRef(0, 1, 256).exists_in(size) and not TileRef(0, 2, 256).exists_in(size)
    assert TileRef(0, 2, 88).exists_in(size) and not TileRef(0, 2, 89).exists_in(size)
    assert TileRef(0, 1, 5).exists_in(size)  # an old partial tile: its hashes never change
    assert TileRef(1, 0, 2).exists_in(size) and not TileRef(1, 0, 3).exists_in(size)
    assert not TileRef(2, 0, 1).exists_in(size)
    assert TileRef(None, 2, 88).exists_in(size) and not TileRef(None, 3, 1).exists_in(size)
    assert TileRef(1, 0, 256).exists_in(65536) and not TileRef(1, 0, 256).exists_in(65535)


def test_a_bundle_is_length_prefixed_entries() -> None:
    assert bundle([(0, b"ab"), (1, b""), (2, b"x" * 300)]) == (
        b"\x00\x02ab" + b"\x00\x00" + b"\x01\x2c" + b"x" * 300
    )
    assert bundle([(7, b"y" * 65535)])[:2] == b"\xff\xff"
    with pytest.raises(EntryTooLarge, match=r"record 8 is 65536 bytes.*records/8/raw"):
        bundle([(8, b"y" * 65536)])
