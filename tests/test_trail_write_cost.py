"""One signed write: the bytes it writes are the documented ones, in the order crash safety needs.

The writer formats each head record and each line from parts it keeps (``anchor._RecordFormat``,
``chain.event_line``, ``chain.with_signed_head``); these tests hold those bytes equal to
``head_record`` and to the canonical JSON of the event, check the syscalls of one write (the
anchor written before any byte of the log, one sync: the log's; a run made before in-log heads
still syncs its anchor first), and kill a writer between the two to show the repair still works.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestrator.trail import events as ev
from orchestrator.trail.anchor import Head, _RecordFormat, anchor_path, head_record
from orchestrator.trail.chain import canonical_json, chain_hash, event_line, line_hash, with_signed_head
from orchestrator.trail.signed_log import member, member_dict
from orchestrator.trail.signing import own_signer
from orchestrator.trail.store import RunStore
from tests.conftest import ROOT, cli
from tests.reliability_kit import events, legacy_anchor_run

STARTED = ev.RunStarted(workflow="toy", target="/t", options={}, base={}, initial_phase="ask")


@pytest.mark.parametrize("run_id", ["r1", "add-moe-model-20261202-101010-abcd", "a.b_c-" + "x" * 190])
@pytest.mark.parametrize("prev", [None, Head(seq=0, hash="ab" * 32), Head(seq=123456, hash="0f" * 32)])
def test_the_writer_makes_the_bytes_head_record_makes(run_id: str, prev: Head | None) -> None:
    signer = own_signer(create=True)
    head = Head(seq=(prev.seq + 1) if prev else 0, hash="cd" * 32)
    for who in (signer, None):  # Ed25519, and the legacy HMAC a pre-Ed25519 run keeps using
        made = _RecordFormat(run_id, "9e" * 32, who).record(head, prev)
        assert made == head_record(run_id, "9e" * 32, head, prev, who)


@pytest.mark.parametrize(("data", "members"), [
    ({"type": "x"}, {}), ({"phase": "nested", "hash": "not the member", ",\"phase\":": [1, {"hash": None}]}, {}),
    ({"text": "é ✓ \u2028 \n \"quoted\"", "n": 1.5e300, "big": 10**30, "empty": {}, "list": []}, {}),
    ({"small": 2.5e-05}, {"phase": "a \"phase\"\\ é\n", "run_id": "r\u2028", "actor": "a\x01"}),
    ([1, "data not an object"], {"schema_version": True}),  # not the writer's envelope: the slow path
    ({}, {"extra": {"nested": 1}}),
    ({"key": "color"}, {"actor": "human", "who": {"kind": "person", "user": "u", "host": "h", "as": "A \"B\"",
                                                   "tty": False, "pid": 7, "command": 'x ,"ts":" ,"hash":"',
                                                   "parent": None}}),  # who acted: sorts last, after "type"
])
def test_event_line_is_the_canonical_line_and_its_hash(data: Any, members: dict) -> None:
    event = {"schema_version": 1, "seq": 3, "ts": "2026-12-02T00:00:00+00:00", "run_id": "r", "type": "x",
             "actor": "engine", "phase": None, "data": data, "prev_hash": "ab" * 32, **members}
    digest, line = event_line("ab" * 32, event)
    assert digest == chain_hash("ab" * 32, event)
    assert line == canonical_json({**event, "hash": digest}) + b"\n"
    for head in (Head(seq=3, hash=digest), Head(seq=7, hash="cd" * 32)):  # a write of this line alone, and longer
        signed = member_dict(head, "ef" * 64, start=3)
        signed_line = with_signed_head(line, member(head, "ef" * 64, start=3))
        assert signed_line == canonical_json({**event, "hash": digest, "signed_head": signed}) + b"\n"
        assert chain_hash("ab" * 32, {**event, "signed_head": signed}) == digest  # the member is not hashed
        assert line_hash("ab" * 32, signed_line[:-1], signed=True) == line_hash("ab" * 32, line[:-1]) == digest


def syscalls_of_two_writes(store: RunStore, run_id: str, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """The write/pwrite/fsync/fdatasync calls of two one-event writes, then of the writer's close."""
    calls: list[tuple[str, str]] = []
    with store.open_run(run_id) as run:
        def name(fd: int) -> str:
            path = Path(os.readlink(f"/proc/self/fd/{fd}"))
            if path == anchor_path(run_id, run._genesis):
                return "anchor"
            return "log" if path.name == "events.jsonl" else "run.json"  # run.json: the temp file flush renames

        for call in ("write", "pwrite", "fsync", "fdatasync"):
            real = getattr(os, call)
            monkeypatch.setattr(os, call, lambda fd, *a, _real=real, _call=call: (
                calls.append((_call, name(fd))), _real(fd, *a))[1])
        run.append(ev.NoteAdded(kind="devlog", text="one"))
        run.append(ev.NoteAdded(kind="devlog", text="two"))
        calls.append(("close", ""))
        real_close = run._anchor.close
        run._anchor.close = lambda: (real_close(), monkeypatch.undo())
    return calls


def test_one_write_costs_one_sync_the_head_written_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = RunStore(tmp_path / "state")
    store.create_run("r", STARTED)
    one_write = [("pwrite", "anchor"), ("write", "log"), ("fsync", "log")]
    closing = [("close", ""), ("fsync", "run.json"), ("fdatasync", "anchor")]  # the anchor: once per writer
    assert syscalls_of_two_writes(store, "r", monkeypatch) == one_write * 2 + closing


def test_a_run_made_before_in_log_heads_still_syncs_its_anchor_first(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    store = RunStore(tmp_path / "state")
    legacy_anchor_run(store, "r", STARTED)
    one_write = [("pwrite", "anchor"), ("fdatasync", "anchor"), ("write", "log"), ("fsync", "log")]
    assert syscalls_of_two_writes(store, "r", monkeypatch) == one_write * 2 + [("close", ""), ("fsync", "run.json")]
    assert all("signed_head" not in e for e in events(tmp_path / "state", "r"))
    assert cli("audit", "r", state_dir=tmp_path / "state").returncode == 0


CRASH_BETWEEN = """
import os, sys
from orchestrator.trail import events as ev
from orchestrator.trail.store import RunStore

def die(fd, data):
    os._exit(9)  # the anchor for this write is durable; not one byte of its lines is written

with RunStore(sys.argv[1]).open_run(sys.argv[2]) as run:
    os.write = die
    run.append_many([ev.NoteAdded(kind="devlog", text="lost"), ev.NoteAdded(kind="devlog", text="lost too")])
"""


def test_a_crash_between_the_anchor_and_the_log_audits_and_heals_as_before(tmp_path: Path) -> None:
    state = tmp_path / "state"
    RunStore(state).create_run("r", STARTED)
    with RunStore(state).open_run("r") as run:
        run.append(ev.NoteAdded(kind="devlog", text="kept"))
    proc = subprocess.run([sys.executable, "-c", CRASH_BETWEEN, str(state), "r"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 9, proc.stderr
    record = json.loads(anchor_path("r", events(state, "r")[0]["hash"]).read_bytes())
    assert (record["seq"], record["prev"][0]) == (3, 1) and len(events(state, "r")) == 2  # the anchor is ahead
    audit = cli("audit", "r", state_dir=state)
    assert audit.returncode == 1 and "announced by the anchor is not (fully) in the log" in audit.stdout
    assert cli("status", "r", "--json", state_dir=state).returncode == 0
    with RunStore(state).open_run("r") as run:  # the next write takes the place of the one that did not land
        run.append(ev.NoteAdded(kind="devlog", text="next"))
    assert [e["data"].get("text") for e in events(state, "r")] == [None, "kept", "next"]
    assert cli("audit", "r", state_dir=state).returncode == 0


def test_utc_now_writes_what_datetime_isoformat_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    from datetime import datetime, timedelta, timezone

    from orchestrator.trail import writer

    epoch = datetime(1970, 1, 1, tzinfo=timezone.utc)
    for ns in (0, 1_764_747_000_123_456_789, 1_764_747_000_999_999_999, 1_764_747_001_000_000_000,
               253_402_300_799 * 10**9):
        monkeypatch.setattr(writer.time, "time_ns", lambda ns=ns: ns)
        assert writer.utc_now() == (epoch + timedelta(microseconds=ns // 1000)).isoformat(timespec="microseconds")
    monkeypatch.undo()
    before = datetime.now(timezone.utc)
    assert before <= datetime.fromisoformat(writer.utc_now()) <= datetime.now(timezone.utc)


def test_a_signal_that_arrives_mid_write_is_handled_after_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import signal
    import threading

    store = RunStore(tmp_path / "state")
    store.create_run("r", STARTED)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # even where the runner ignores SIGINT
    try:
        with store.open_run("r") as run:
            real = os.fsync

            def fsync_interrupted(fd: int) -> None:
                # NOTE: only the log's own sync: another file synced first (an anchor dir made on first use,
                # depending on what ran before in the session) is outside the held write. The signal goes to
                # the writing thread: the hold is a thread's mask, and in a process with more threads (an xdist
                # worker's I/O thread) the kernel may hand a process-wide signal to another one.
                if os.readlink(f"/proc/self/fd/{fd}").endswith("events.jsonl"):
                    signal.pthread_kill(threading.get_ident(), signal.SIGINT)
                real(fd)

            monkeypatch.setattr(os, "fsync", fsync_interrupted)
            with pytest.raises(KeyboardInterrupt):  # raised once the write is done, not inside it
                run.append(ev.NoteAdded(kind="devlog", text="landed whole"))
            monkeypatch.undo()
            assert run.state["last_seq"] == 1 and signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, [])
    finally:
        signal.signal(signal.SIGINT, previous)
    assert events(tmp_path / "state", "r")[-1]["data"]["text"] == "landed whole"
    assert cli("audit", "r", state_dir=tmp_path / "state").returncode == 0


def test_a_short_write_is_finished_before_the_sync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = RunStore(tmp_path / "state")
    store.create_run("r", STARTED)
    with store.open_run("r") as run:
        real, sizes = os.write, []
        monkeypatch.setattr(os, "write", lambda fd, data: sizes.append(len(data)) or real(fd, bytes(data[:7])))
        run.append(ev.NoteAdded(kind="devlog", text="in pieces"))
        monkeypatch.undo()
    assert len(sizes) > 2 and sizes[1] == sizes[0] - 7
    assert events(tmp_path / "state", "r")[-1]["data"]["text"] == "in pieces"
    assert cli("audit", "r", state_dir=tmp_path / "state").returncode == 0
