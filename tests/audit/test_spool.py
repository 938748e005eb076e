"""The spool: records survive a reopen byte for byte, a torn tail is cut, damage is named.

Truncation at every byte offset stands in for a crash mid-``append`` (the kernel may have
written any prefix of the batch); reopening must then yield a prefix of what was appended.
"""

from __future__ import annotations

import errno
import os
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from audit.spool import Spool, SpoolCorrupt, claim, decode_line, encode_line, slot_path

PAYLOADS = [b"first", b"", b"line\nbreak\r\n", bytes(range(256)), b"\n", b"last"]


def lines_of(path: Path) -> list[bytes]:
    return path.read_bytes().split(b"\n")[:-1]


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "spool" / "ledger.spool"


# --- round trip -----------------------------------------------------------------------------------


def test_a_missing_spool_is_empty_and_its_directory_is_created(path: Path) -> None:
    spool = Spool(path)
    assert len(spool) == 0
    assert spool.read() == []
    assert path.parent.is_dir()
    assert not path.exists()


def test_binary_payloads_read_back_in_order(path: Path) -> None:
    spool = Spool(path)
    spool.append(PAYLOADS[:2])
    spool.append(PAYLOADS[2:])
    assert spool.read() == PAYLOADS
    assert len(spool) == len(PAYLOADS)


def test_one_line_per_record_whatever_the_payload(path: Path) -> None:
    Spool(path).append(PAYLOADS)
    assert len(lines_of(path)) == len(PAYLOADS)
    assert path.read_bytes().endswith(b"\n")


def test_an_empty_batch_writes_nothing(path: Path) -> None:
    spool = Spool(path)
    spool.append([])
    assert not path.exists()
    assert len(spool) == 0


def test_the_file_is_created_with_mode_0600(path: Path) -> None:
    old = os.umask(0)  # the mode must come from the open call, not from a kind umask
    try:
        Spool(path).append([b"x"])
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_len_counts_records_across_reopen(path: Path) -> None:
    Spool(path).append(PAYLOADS)
    reopened = Spool(path)
    assert len(reopened) == len(PAYLOADS)
    reopened.append([b"more"])
    assert len(Spool(path)) == len(PAYLOADS) + 1
    assert Spool(path).read() == [*PAYLOADS, b"more"]


def test_clear_empties_the_spool_and_later_appends_start_afresh(path: Path) -> None:
    spool = Spool(path)
    spool.append(PAYLOADS)
    spool.clear()
    assert len(spool) == 0
    assert spool.read() == []
    assert len(Spool(path)) == 0
    spool.append([b"after"])
    assert Spool(path).read() == [b"after"]


def test_clear_of_a_spool_never_written_is_harmless(path: Path) -> None:
    spool = Spool(path)
    spool.clear()
    assert len(spool) == 0
    assert not path.exists()


def test_lines_are_checksum_space_base64() -> None:
    line = encode_line(b"\x00\n payload")
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    checksum, _, encoded = line[:-1].partition(b" ")
    assert len(checksum) == 32 and all(c in b"0123456789abcdef" for c in checksum)
    assert decode_line(line[:-1]) == b"\x00\n payload"
    assert decode_line(checksum + b" " + encoded[:-4]) is None
    assert decode_line(checksum) is None
    assert decode_line(checksum + b" !!notbase64") is None


# --- torn tail ------------------------------------------------------------------------------------


def test_a_partial_last_line_is_cut_at_open(path: Path) -> None:
    Spool(path).append(PAYLOADS)
    whole = path.read_bytes()
    path.write_bytes(whole + encode_line(b"torn")[:-7])
    spool = Spool(path)
    assert path.read_bytes() == whole
    assert len(spool) == len(PAYLOADS)
    spool.append([b"later"])
    assert Spool(path).read() == [*PAYLOADS, b"later"]


def test_a_complete_last_line_with_a_bad_checksum_is_cut_at_open(path: Path) -> None:
    Spool(path).append(PAYLOADS)
    whole = path.read_bytes()
    bad = encode_line(b"half written")
    bad = bad[:40] + (b"A" if bad[40:41] != b"A" else b"B") + bad[41:]
    path.write_bytes(whole + bad)
    spool = Spool(path)
    assert path.read_bytes() == whole
    assert len(spool) == len(PAYLOADS)
    spool.append([b"later", b""])
    assert Spool(path).read() == [*PAYLOADS, b"later", b""]


def test_a_spool_holding_only_a_torn_line_opens_empty(path: Path) -> None:
    path.parent.mkdir(parents=True)
    path.write_bytes(encode_line(b"never acknowledged")[:10])
    spool = Spool(path)
    assert len(spool) == 0
    assert path.read_bytes() == b""
    spool.append([b"x"])
    assert spool.read() == [b"x"]


def test_a_bad_line_before_the_last_is_damage_and_named(path: Path) -> None:
    Spool(path).append([b"one", b"two", b"three"])
    lines = lines_of(path)
    lines[1] = lines[1][:-2] + b"=="  # still base64, wrong checksum
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    with pytest.raises(SpoolCorrupt, match="line 2"):  # at open: the operator learns at start
        Spool(path)
    assert len(lines_of(path)) == 3  # nothing is dropped


def test_damage_is_reported_even_when_the_torn_tail_is_cut(path: Path) -> None:
    Spool(path).append([b"one", b"two", b"three"])
    lines = lines_of(path)
    lines[0] = b"0" * 32 + lines[0][32:]
    path.write_bytes(b"".join(line + b"\n" for line in lines) + b"torn")
    with pytest.raises(SpoolCorrupt, match="line 1"):
        Spool(path)


@pytest.mark.parametrize("failure", ["short write then ENOSPC", "fsync fails"])
def test_a_failed_append_leaves_no_trace(
    path: Path, monkeypatch: pytest.MonkeyPatch, failure: str
) -> None:
    """A disk that fills up mid-batch: the batch was refused (its submitters were told so), so
    nothing of it may remain to glue itself onto the next, acknowledged batch."""
    spool = Spool(path)
    spool.append([b"acknowledged"])
    real_write, calls = os.write, []

    def short_write(fd: int, data: bytes | memoryview) -> int:
        calls.append(len(data))
        if len(calls) == 1:  # the disk fills up within the first write: a short count...
            return real_write(fd, bytes(data)[:10])
        raise OSError(errno.ENOSPC, "No space left on device")  # ...then no space at all

    def failing_fsync(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    with monkeypatch.context() as patch:
        if failure == "fsync fails":
            patch.setattr(os, "fsync", failing_fsync)
        else:
            patch.setattr(os, "write", short_write)
        with pytest.raises(OSError, match=r"No space left|Input/output error"):
            spool.append([b"refused one", b"refused two"])
    assert len(spool) == 1
    spool.append([b"acknowledged later"])
    assert spool.read() == [b"acknowledged", b"acknowledged later"]
    assert Spool(path).read() == [b"acknowledged", b"acknowledged later"]


# --- properties -----------------------------------------------------------------------------------


def fresh_path() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as directory:
        yield Path(directory) / "ledger.spool"


BATCHES = st.lists(st.lists(st.binary(max_size=80), max_size=6), max_size=6)


@settings(max_examples=150, deadline=None)
@given(batches=BATCHES)
def test_any_payloads_round_trip(batches: list[list[bytes]]) -> None:
    for path in fresh_path():
        spool = Spool(path)
        for batch in batches:
            spool.append(batch)
        expected = [p for batch in batches for p in batch]
        assert spool.read() == expected
        assert len(spool) == len(expected)
        assert Spool(path).read() == expected
        assert len(Spool(path)) == len(expected)


@settings(max_examples=25, deadline=None)
@given(payloads=st.lists(st.binary(max_size=24), max_size=6))
def test_truncation_at_any_offset_reopens_to_a_prefix(payloads: list[bytes]) -> None:
    """Never garbage, never an exception: every byte offset of the file is tried."""
    for path in fresh_path():
        Spool(path).append([*payloads, b"end"])
        whole = path.read_bytes()
        payloads = [*payloads, b"end"]
        for offset in range(len(whole) + 1):
            path.write_bytes(whole[:offset])
            spool = Spool(path)
            kept = spool.read()
            assert kept == payloads[: len(kept)]
            assert len(spool) == len(kept)
            assert kept == payloads[: whole[:offset].count(b"\n")]
            spool.append([b"after"])
            assert Spool(path).read() == [*kept, b"after"]


# --- one file per process (claim) -------------------------------------------------------------


def test_processes_on_one_path_each_claim_a_file_and_clear_only_their_own(path: Path) -> None:
    first, second = claim(path), claim(path)
    try:
        assert first.path == path and second.path == slot_path(path, 1)
        first.append([b"first's"])
        second.append([b"second's"])
        first.clear()  # after its records reached the database
        assert second.read() == [b"second's"] and len(second) == 1
        third = claim(path)  # neither takes nor adopts a live process's file
        assert third.path == slot_path(path, 2) and third.read() == []
        assert second.read() == [b"second's"]
        third.release()
    finally:
        first.release()
        second.release()


def test_a_dead_processs_records_are_adopted_by_the_next_claim(path: Path) -> None:
    """A worker killed with records spooled: the next process to start takes them over."""
    live = claim(path)  # slot 0, held by this (live) process throughout
    live.append([b"live"])
    script = (
        "import os, signal, sys; from pathlib import Path; from audit.spool import claim\n"
        "spool = claim(Path(sys.argv[1])); spool.append([b'a', b'b'])\n"
        "print(spool.path, flush=True); os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    died = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True,
                          text=True, cwd=Path(__file__).parents[2])  # fmt: skip
    assert died.returncode == -signal.SIGKILL, died.stderr
    orphan = Path(died.stdout.strip())
    assert orphan == slot_path(path, 1) and Spool(orphan).read() == [b"a", b"b"]
    heir = claim(path)
    try:
        assert heir.path == orphan  # the first free slot: the dead one's own
        assert heir.read() == [b"a", b"b"]  # its own file: replayed as a predecessor's
        assert live.read() == [b"live"]  # a live process's records are never taken
    finally:
        heir.release()
        live.release()


def test_a_claim_adopts_records_left_in_a_higher_slot(path: Path) -> None:
    """Fewer workers than before: slot 2's records (nobody holds it) move to the claimant."""
    Spool(slot_path(path, 2)).append([b"left", b"behind"])
    spool = claim(path)
    try:
        assert spool.path == path
        assert spool.read() == [b"left", b"behind"] and len(spool) == 2
        assert Spool(slot_path(path, 2)).read() == []
    finally:
        spool.release()


def test_a_released_slot_is_claimed_again_with_its_records(path: Path) -> None:
    spool = claim(path)
    spool.append([b"kept"])
    spool.release()
    again = claim(path)
    try:
        assert again.path == path and again.read() == [b"kept"]
    finally:
        again.release()


def test_a_damaged_slot_refuses_the_claim_and_holds_nothing(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"garbage line\n" + encode_line(b"ok"))  # damage before the last line
    with pytest.raises(SpoolCorrupt):
        claim(path)
    path.write_bytes(encode_line(b"ok"))  # repaired: the slot was let go
    spool = claim(path)
    try:
        assert spool.path == path and spool.read() == [b"ok"]
    finally:
        spool.release()
