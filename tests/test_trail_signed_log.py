"""In-log heads: the log verifies with the public key alone, and the anchor may lag it after a power loss.

Each write's first line signs where the write ends (``trail.signed_log``); the anchor outside the
state dir is pwritten before the lines and synced only on close. These tests make the states a
crash or a tamper leaves by hand: lines appended without the key, a head signed by another key,
an anchor reverted to an older valid head (what a power loss leaves when its page never went
out), a write cut short after its first line, and a truncation behind a witnessed head.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.errors import TrailCorrupt
from orchestrator.trail import events as ev
from orchestrator.trail.anchor import Head, anchor_path, signed_body
from orchestrator.trail.audit import audit_trail
from orchestrator.trail.chain import chain_hash, line_hash
from orchestrator.trail.snapshot import replay
from orchestrator.trail.store import RunStore
from tests.conftest import cli
from tests.reliability_kit import events

STARTED = ev.RunStarted(workflow="toy", target="/t", options={}, base={}, initial_phase="ask")


@pytest.fixture
def run(tmp_path: Path) -> tuple[RunStore, Path]:
    """A run of four writes: genesis, one note, two notes, one note (seq 0 | 1 | 2-3 | 4)."""
    store = RunStore(tmp_path / "state")
    store.create_run("r", STARTED)
    with store.open_run("r") as opened:
        opened.append(note("one"))
        opened.append_many([note("two"), note("three")])
        opened.append(note("four"))
    return store, store.run_dir("r")


def note(text: str) -> ev.NoteAdded:
    return ev.NoteAdded(kind="devlog", text=text)


def write_log(run_dir: Path, trail: list[dict[str, Any]]) -> None:
    """The lines and a run.json equal to their fold, as a careful forger writes them."""
    lines = [json.dumps(e, sort_keys=True, separators=(",", ":"), ensure_ascii=False) + "\n" for e in trail]
    (run_dir / "events.jsonl").write_text("".join(lines))
    (run_dir / "run.json").write_text(json.dumps(replay(trail, run_id=run_dir.name), indent=1, sort_keys=True))


def appended(trail: list[dict[str, Any]], text: str) -> dict[str, Any]:
    """A note chained onto ``trail`` by the documented rule: what anyone can make without the key."""
    last = trail[-1]
    event = {"schema_version": 1, "seq": last["seq"] + 1, "ts": last["ts"], "run_id": last["run_id"],
             "type": "note_added", "actor": "engine", "phase": None,
             "data": {"type": "note_added", "kind": "devlog", "text": text}, "prev_hash": last["hash"]}
    return {**event, "hash": chain_hash(last["hash"], event)}


def findings(run_dir: Path, **options: Any) -> list[tuple[str, str]]:
    return [(f.check, f.message) for f in audit_trail(run_dir, **options).findings]


def refused(store: RunStore) -> bool:
    try:
        with store.open_run("r"):
            return False
    except TrailCorrupt:
        return True


def test_a_run_made_now_signs_every_write_in_its_log(run: tuple[RunStore, Path]) -> None:
    store, run_dir = run
    trail = events(store.state_dir, "r")
    assert [(e["seq"], e["signed_head"].get("seq")) for e in trail if "signed_head" in e] == [
        (0, None), (1, None), (2, 3), (4, None)]  # a write of one line leaves its own seq and hash out
    for line, event in zip((run_dir / "events.jsonl").read_bytes().splitlines(), trail):
        assert line_hash(event["prev_hash"], line, signed="signed_head" in event) == event["hash"]
    assert findings(run_dir) == [] and findings(run_dir, anchor=False) == []


def test_lines_appended_without_the_key_after_a_valid_signed_head_are_refused(run: tuple[RunStore, Path]) -> None:
    store, run_dir = run
    trail = events(store.state_dir, "r")
    write_log(run_dir, trail + [appended(trail, "forged")])
    for options in ({}, {"anchor": False}):  # the log alone says so: no anchor needed
        assert findings(run_dir, **options) == [("signature", "the lines from seq 5 on carry no signed head: every "
                                                 "write of this run starts with one, so they were appended by "
                                                 "someone without the key")]
    assert refused(store)


def sign_with_another_key(head: Head, prev: Head | None, genesis: str) -> str:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    return Ed25519PrivateKey.generate().sign(signed_body("r", genesis, head, prev)).hex()


def test_a_write_signed_by_another_key_is_refused(run: tuple[RunStore, Path]) -> None:
    store, run_dir = run
    trail = events(store.state_dir, "r")
    forged = appended(trail, "forged")
    head, prev = Head(seq=5, hash=forged["hash"]), Head(seq=4, hash=trail[-1]["hash"])
    forged["signed_head"] = {"hash": head.hash, "seq": 5, "sig": sign_with_another_key(head, prev, trail[0]["hash"])}
    write_log(run_dir, trail + [forged])
    [(check, message)] = findings(run_dir)
    assert check == "signature" and "seq 5 (to seq 5) has a bad signature" in message
    assert refused(store)


def test_a_signature_edited_in_the_middle_of_the_log_is_an_audit_finding(run: tuple[RunStore, Path]) -> None:
    """The anchor vouches for the chain up to its head, so a writer checks no older signature; audit checks all."""
    store, run_dir = run
    trail = events(store.state_dir, "r")
    trail[2]["signed_head"]["sig"] = sign_with_another_key(Head(seq=3, hash=trail[3]["hash"]),
                                                           Head(seq=1, hash=trail[1]["hash"]), trail[0]["hash"])
    write_log(run_dir, trail)
    assert [check for check, _ in findings(run_dir)] == ["signature"]
    assert not refused(store)


def test_an_anchor_reverted_to_an_older_valid_head_lags_and_audits_intact(run: tuple[RunStore, Path]) -> None:
    """A power loss before the anchor's page went out: the log's own signatures vouch for the rest."""
    store, run_dir = run
    anchor = anchor_path("r", events(store.state_dir, "r")[0]["hash"])
    older = anchor.read_bytes()
    with store.open_run("r") as opened:
        opened.append(note("five"))
        opened.append(note("six"))
    anchor.write_bytes(older)
    audit = audit_trail(run_dir)
    assert audit.findings == [] and audit.signed_by.startswith("ed25519 key ")
    assert [n.split(",")[0] for n in audit.notes] == ["the anchor names seq 4"]
    shown = cli("audit", "r", state_dir=store.state_dir)
    assert shown.returncode == 0 and "note: the anchor names seq 4" in shown.stdout
    with store.open_run("r") as opened:  # not refused; the next write brings the anchor level
        opened.append(note("seven"))
    assert json.loads(anchor.read_bytes())["seq"] == 7 and audit_trail(run_dir).notes == []


def test_an_anchor_left_at_a_write_that_never_landed_and_was_replaced_lags(run: tuple[RunStore, Path]) -> None:
    """A kill after the anchor's pwrite (nothing of the write landed), the next command's write, then a power
    loss before the anchor's page went out again: the anchor names a write the log replaced."""
    from orchestrator.trail.anchor import write_anchor

    store, run_dir = run
    trail = events(store.state_dir, "r")
    write_anchor("r", trail[0]["hash"], Head(seq=5, hash="ab" * 32), Head(seq=4, hash=trail[4]["hash"]),
                 trail[0]["data"]["signer"])
    anchor = anchor_path("r", trail[0]["hash"])
    announced = anchor.read_bytes()
    with store.open_run("r") as opened:
        opened.append(note("five"))
    anchor.write_bytes(announced)
    audit = audit_trail(run_dir)
    assert audit.findings == [] and [n.split(" (")[0] for n in audit.notes] == [
        "the anchor names a write after seq 4 that did not land, and the log went on from there with another"]
    assert not refused(store)


def test_a_write_cut_short_after_its_first_line_is_repaired_though_the_anchor_never_saw_it(
        run: tuple[RunStore, Path]) -> None:
    """Power loss mid-fsync: the anchor's page stayed behind, the write's first line (its announcement) landed."""
    store, run_dir = run
    log, snapshot = run_dir / "events.jsonl", run_dir / "run.json"
    anchor = anchor_path("r", events(store.state_dir, "r")[0]["hash"])
    before, older, stale = log.read_bytes(), anchor.read_bytes(), snapshot.read_bytes()
    with store.open_run("r") as opened:
        opened.append_many([note("five"), note("six"), note("seven")])
    first_line = log.read_bytes()[len(before):].split(b"\n")[0] + b"\n"
    log.write_bytes(before + first_line + b'{"actor":"eng')
    anchor.write_bytes(older)
    snapshot.write_bytes(stale)  # the writer never reached its flush
    audit = audit_trail(run_dir).findings
    assert all(f.repairable for f in audit) and any(
        "seq 5..7 announced in the log is not (fully) in the log" in f.message for f in audit), audit
    with store.open_run("r") as opened:
        opened.append(note("after"))
    trail = events(store.state_dir, "r")
    repaired = [e["data"] for e in trail if e["type"] == "trail_repaired"]
    assert repaired == [{"type": "trail_repaired", "lost_seqs": [5, 6, 7], "dropped_lines": 1, "torn_bytes": 13}]
    assert findings(run_dir) == []


def test_a_torn_line_no_signed_head_announces_is_refused(run: tuple[RunStore, Path]) -> None:
    store, run_dir = run
    with open(run_dir / "events.jsonl", "ab") as handle:
        handle.write(b'{"actor":"engine","data":{')
    assert ("anchor", "26 bytes follow the signed head (seq 4) and no signed head announces them") in findings(run_dir)
    assert refused(store)


def test_a_log_cut_behind_the_anchor_is_refused(run: tuple[RunStore, Path]) -> None:
    store, run_dir = run
    write_log(run_dir, events(store.state_dir, "r")[:2])  # drops the writes 2-3 and 4: a clean cut, all signed
    [(check, message)] = findings(run_dir)
    assert check == "anchor" and message.startswith("the log's last signed head is seq 1 but the anchor")
    assert refused(store)


def test_truncation_behind_a_witnessed_head_is_caught_while_the_anchor_lags(run: tuple[RunStore, Path],
                                                                            tmp_path: Path) -> None:
    """The lag's window: a cut back to the anchor's own head passes alone, and a witness catches it."""
    store, run_dir = run
    anchor = anchor_path("r", events(store.state_dir, "r")[0]["hash"])
    older = anchor.read_bytes()
    with store.open_run("r") as opened:
        opened.append(note("five"))
    witness = tmp_path / "witnessed.json"
    assert cli("witness", "r", "--to", str(witness), state_dir=store.state_dir).returncode == 0
    anchor.write_bytes(older)
    write_log(run_dir, events(store.state_dir, "r")[:5])
    assert findings(run_dir) == []
    audit = json.loads(cli("audit", "r", "--json", "--witness", str(witness), state_dir=store.state_dir).stdout)
    assert [f["check"] for f in audit["findings"]] == ["witness"], audit


def test_witness_takes_the_logs_last_signed_head_when_the_anchor_lags(run: tuple[RunStore, Path],
                                                                     tmp_path: Path) -> None:
    """After a power loss the anchor may name an older head: the witness takes the head the log proves, so a
    later cut back to the anchor's head is caught."""
    store, run_dir = run
    anchor = anchor_path("r", events(store.state_dir, "r")[0]["hash"])
    older = anchor.read_bytes()
    with store.open_run("r") as opened:
        opened.append(note("five"))
        opened.append_many([note("six"), note("seven")])
    anchor.write_bytes(older)  # its page never went out: it names seq 4, the log is signed to seq 7
    witness = tmp_path / "witnessed.json"
    shown = cli("witness", "r", "--to", str(witness), state_dir=store.state_dir)
    assert shown.returncode == 0 and "head seq 7 witnessed" in shown.stdout, shown.stdout + shown.stderr
    record = json.loads(witness.read_text())
    assert (record["seq"], record["prev"][0]) == (7, 5) and record["hash"] == events(store.state_dir, "r")[7]["hash"]
    assert cli("audit", "r", "--witness", str(witness), state_dir=store.state_dir).returncode == 0
    write_log(run_dir, events(store.state_dir, "r")[:5])  # back to the anchor's head: passes without the witness
    assert findings(run_dir) == []
    audit = json.loads(cli("audit", "r", "--json", "--witness", str(witness), state_dir=store.state_dir).stdout)
    assert [f["check"] for f in audit["findings"]] == ["witness"], audit


def test_witness_takes_no_head_of_a_write_that_did_not_land(run: tuple[RunStore, Path], tmp_path: Path) -> None:
    """A write cut short (the anchor one write ahead): the witness takes the log's last complete head, which the
    repair keeps, not the head announced."""
    store, run_dir = run
    log, snapshot = run_dir / "events.jsonl", run_dir / "run.json"
    before, stale = log.read_bytes(), snapshot.read_bytes()
    with store.open_run("r") as opened:
        opened.append_many([note("five"), note("six")])
    log.write_bytes(before + log.read_bytes()[len(before):].split(b"\n")[0] + b"\n")  # only the first line landed
    snapshot.write_bytes(stale)  # the writer never reached its flush
    witness = tmp_path / "witnessed.json"
    assert cli("witness", "r", "--to", str(witness), state_dir=store.state_dir).returncode == 0
    assert json.loads(witness.read_text())["seq"] == 4
    with store.open_run("r") as opened:  # the repair, then a write that takes the place of the lost one
        opened.append(note("after"))
    assert cli("audit", "r", "--witness", str(witness), state_dir=store.state_dir).returncode == 0


def test_witness_refuses_a_trail_with_a_finding(run: tuple[RunStore, Path], tmp_path: Path) -> None:
    store, run_dir = run
    trail = events(store.state_dir, "r")
    write_log(run_dir, [*trail, appended(trail, "forged")])  # lines no signed head announces
    witness = tmp_path / "witnessed.json"
    shown = cli("witness", "r", "--to", str(witness), state_dir=store.state_dir)
    assert shown.returncode != 0 and "no signed head" in shown.stderr + shown.stdout and not witness.exists()


def test_witness_of_a_run_made_before_in_log_heads_copies_its_anchor_record(tmp_path: Path) -> None:
    from tests.reliability_kit import legacy_anchor_run

    store = RunStore(tmp_path / "state")
    legacy_anchor_run(store, "r", STARTED)
    with store.open_run("r") as opened:
        opened.append(note("one"))
    witness = tmp_path / "witnessed.json"
    assert cli("witness", "r", "--to", str(witness), state_dir=store.state_dir).returncode == 0
    anchor = anchor_path("r", events(store.state_dir, "r")[0]["hash"])
    assert json.loads(witness.read_text()) == json.loads(anchor.read_bytes())
    assert cli("audit", "r", "--witness", str(witness), state_dir=store.state_dir).returncode == 0


def test_a_signed_head_added_to_a_run_made_before_in_log_heads_is_a_finding(tmp_path: Path) -> None:
    """The member is not hashed, so the chain alone would not notice it on a run whose genesis names no in-log heads."""
    from tests.reliability_kit import legacy_anchor_run

    store = RunStore(tmp_path / "state")
    legacy_anchor_run(store, "r", STARTED)
    trail = events(store.state_dir, "r")
    trail[0]["signed_head"] = {"hash": trail[0]["hash"], "seq": 0, "sig": "00" * 64}
    write_log(store.run_dir("r"), trail)
    assert findings(store.run_dir("r")) == [("signature", "seq 0 carries a signed head, but the run's genesis does "
                                                          "not say its heads are in the log")]
    assert refused(store)
