"""The trail: hash chain, replay == snapshot, tamper detection that names the seq."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from orchestrator import engine
from orchestrator.trail.audit import audit_run
from orchestrator.trail.events import GENESIS_HASH, canonical_json
from orchestrator.trail.snapshot import replay
from orchestrator.trail.store import RunStore


@pytest.fixture
def finished_run(toy_repo: Path, state_dir: Path) -> tuple[RunStore, str]:
    store = RunStore(state_dir)
    run_id = engine.start("toy", {"target": str(toy_repo), "color": "red"}, store=store).run_id
    (toy_repo / "allowed" / "fixed.txt").write_text("done\n")
    outcome = engine.advance(run_id, store=store)
    assert outcome.state["status"] == "done", outcome.state
    return store, run_id


def lines_of(store: RunStore, run_id: str) -> list[str]:
    return (store.run_dir(run_id) / "events.jsonl").read_text().splitlines()


def write_lines(store: RunStore, run_id: str, lines: list[str]) -> None:
    (store.run_dir(run_id) / "events.jsonl").write_text("".join(line + "\n" for line in lines))


def edit_event(store: RunStore, run_id: str, seq: int, **fields: str) -> None:
    """Overwrite ``fields`` of event ``seq`` in place, leaving its hash as it was (a tamper)."""
    lines = lines_of(store, run_id)
    event = json.loads(lines[seq]) | fields
    lines[seq] = json.dumps(event, sort_keys=True, separators=(",", ":"))
    write_lines(store, run_id, lines)


def test_chain_is_recomputable_without_our_code(finished_run):
    store, run_id = finished_run
    prev = GENESIS_HASH
    for seq, line in enumerate(lines_of(store, run_id)):
        event = json.loads(line)
        body = {k: v for k, v in event.items() if k not in ("hash", "signed_head")}
        text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        assert event["seq"] == seq and event["prev_hash"] == prev
        assert event["hash"] == hashlib.sha256((prev + text).encode()).hexdigest()
        prev = event["hash"]


def test_every_write_is_signed_in_the_log_and_verifies_without_our_code(finished_run):
    """state/README.md's rule, redone with `cryptography` alone: each write's first line signs where it ends."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    store, run_id = finished_run
    trail = [json.loads(line) for line in lines_of(store, run_id)]
    key = Ed25519PublicKey.from_public_bytes(bytes.fromhex(trail[0]["data"]["signer"]["public_key"]))
    assert trail[0]["data"]["heads"] == "in_log"
    start = 0
    while start < len(trail):
        head = {"seq": start, "hash": trail[start]["hash"], **trail[start]["signed_head"]}  # a one-line write: its own
        prev = [start - 1, trail[start - 1]["hash"]] if start else None
        body = json.dumps([run_id, trail[0]["hash"], head["seq"], head["hash"], prev], separators=(",", ":"))
        key.verify(bytes.fromhex(head["sig"]), body.encode())  # raises InvalidSignature when it does not verify
        assert trail[head["seq"]]["hash"] == head["hash"]
        assert not any("signed_head" in e for e in trail[start + 1:head["seq"] + 1])
        start = head["seq"] + 1


def test_snapshot_equals_replay(finished_run):
    store, run_id = finished_run
    stored = json.loads((store.run_dir(run_id) / "run.json").read_text())
    assert stored == replay(store.read_events(run_id), run_id=run_id)
    assert stored["phase"] == "done" and stored["measurements"] == 1
    assert audit_run(store.run_dir(run_id)) == []


def test_canonical_json_refuses_nan():
    with pytest.raises(ValueError):
        canonical_json({"x": float("nan")})


def test_edit_is_detected_at_its_seq(finished_run):
    store, run_id = finished_run
    edit_event(store, run_id, 5, actor="human")
    findings = audit_run(store.run_dir(run_id))
    assert any(f.seq == 5 and f.check == "chain" and "edited" in f.message for f in findings), findings


def test_delete_is_detected(finished_run):
    store, run_id = finished_run
    lines = lines_of(store, run_id)
    del lines[4]
    write_lines(store, run_id, lines)
    findings = audit_run(store.run_dir(run_id))
    assert any(f.seq == 5 and "expected 4" in f.message for f in findings), findings


def test_reorder_is_detected(finished_run):
    store, run_id = finished_run
    lines = lines_of(store, run_id)
    lines[3], lines[4] = lines[4], lines[3]
    write_lines(store, run_id, lines)
    seqs = {f.seq for f in audit_run(store.run_dir(run_id))}
    assert {3, 4} <= seqs


def test_truncated_last_line_is_detected(finished_run):
    store, run_id = finished_run
    path = store.run_dir(run_id) / "events.jsonl"
    raw = path.read_bytes()
    path.write_bytes(raw[:-40])
    findings = audit_run(store.run_dir(run_id))
    last = len(raw.splitlines()) - 1
    assert any(f.seq == last and "truncated" in f.message for f in findings), findings


def test_tampered_artifact_and_snapshot_are_detected(finished_run):
    store, run_id = finished_run
    run_dir = store.run_dir(run_id)
    (run_dir / "artifacts" / "square.json").write_text('{"square": 50}\n')
    state = json.loads((run_dir / "run.json").read_text())
    state["phase"] = "work"
    (run_dir / "run.json").write_text(json.dumps(state))
    checks = {f.check for f in audit_run(run_dir)}
    assert {"artifact", "snapshot"} <= checks


def test_stale_snapshot_after_crash_is_rebuilt_from_the_log(finished_run):
    store, run_id = finished_run
    run_dir = store.run_dir(run_id)
    (run_dir / "run.json").write_text("{}")
    assert store.read_state(run_id)["status"] == "done"


def test_audit_cli_exits_1_and_names_the_seq(finished_run, invoke):
    store, run_id = finished_run
    edit_event(store, run_id, 2, ts="2020-01-01T00:00:00+00:00")
    result = invoke("audit", run_id, "--state-dir", str(store.state_dir), "--json")
    assert result.exit_code == 1
    findings = json.loads(result.output)["findings"]
    assert findings[0]["seq"] == 2 and findings[0]["check"] == "chain"


def test_key_export_is_the_public_key_the_run_recorded(finished_run, invoke, tmp_path: Path) -> None:
    store, run_id = finished_run
    exported = tmp_path / "trail.pub.json"
    assert invoke("key", "--export", str(exported)).exit_code == 0
    signer = json.loads(exported.read_text())
    assert store.read_first_event(run_id)["data"]["signer"] == signer
    assert "private" not in exported.read_text() and len(bytes.fromhex(signer["public_key"])) == 32
    audit = invoke("audit", run_id, "--state-dir", str(store.state_dir))
    assert audit.exit_code == 0 and "head signed by ed25519 key" in audit.output, audit.output
