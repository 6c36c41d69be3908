"""Reliability: tamper with a run in every way we know; audit must catch it and the engine must refuse.

Tampers by someone who can write the state dir (not the anchor dir): audit exits 1 and
advance exits 2 with one line naming `orchestrator audit`, writing nothing. Forgeries by
someone who also holds the trail key (re-anchored): the engine cannot tell, audit's meaning
checks against the workflow table must.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Callable

import pytest

from orchestrator import engine
from orchestrator.trail.anchor import Head, anchor_path, signed_body, write_anchor
from orchestrator.trail.chain import GENESIS_HASH, chain_hash
from orchestrator.trail.snapshot import replay
from orchestrator.trail.store import RunStore
from tests.conftest import cli, make_repo
from tests.reliability_kit import events

Tamper = Callable[[Path, list[dict[str, Any]]], None]


def write_trail(run_dir: Path, trail: list[dict[str, Any]], *, rehash: bool = True, snapshot: bool = True) -> None:
    """Write events (re-chained when ``rehash``) and a run.json equal to their fold, as a careful forger would."""
    prev = GENESIS_HASH
    for seq, event in enumerate(trail):
        if rehash:
            event["seq"], event["prev_hash"] = seq, prev
            event["hash"] = chain_hash(prev, {k: v for k, v in event.items() if k != "hash"})
        prev = event["hash"]
    lines = [json.dumps(e, sort_keys=True, separators=(",", ":"), ensure_ascii=False) + "\n" for e in trail]
    (run_dir / "events.jsonl").write_text("".join(lines))
    if snapshot:
        state = replay(trail, run_id=run_dir.name)
        (run_dir / "run.json").write_text(json.dumps(state, indent=1, sort_keys=True))


def forged(trail: list[dict[str, Any]], type_: str, data: dict[str, Any], *, actor: str = "human",
           phase: str | None = None) -> dict[str, Any]:
    last = trail[-1]
    return {"schema_version": 1, "seq": last["seq"] + 1, "ts": last["ts"], "run_id": last["run_id"], "type": type_,
            "actor": actor, "phase": phase, "data": {"type": type_, **data}, "prev_hash": last["hash"], "hash": ""}


def reanchor(run_dir: Path) -> None:
    """What only a holder of the signing key can do: sign the forged head, in the log (as one write
    from seq 0 to the end, the old heads dropped) and in the anchor."""
    from orchestrator.trail import signing

    trail = events(run_dir.parent.parent, run_dir.name)
    head = Head(seq=trail[-1]["seq"], hash=trail[-1]["hash"])
    for event in trail:
        event.pop("signed_head", None)
    sig = signing.sign(signed_body(run_dir.name, trail[0]["hash"], head, None))
    trail[0]["signed_head"] = {"hash": head.hash, "seq": head.seq, "sig": sig}
    write_trail(run_dir, trail, rehash=False, snapshot=False)
    write_anchor(run_dir.name, trail[0]["hash"], head, None, trail[0]["data"]["signer"])


def another_key() -> Any:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    return Ed25519PrivateKey.generate()


def sign_with(other: Any, run_dir: Path, trail: list[dict[str, Any]]) -> str:
    """A head for the trail as it now stands, Ed25519-signed by ``other`` (not the run's key); its public key."""
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    head = Head(seq=trail[-1]["seq"], hash=trail[-1]["hash"])
    record = {"run_id": run_dir.name, "genesis": trail[0]["hash"], "seq": head.seq, "hash": head.hash, "prev": None,
              "sig": other.sign(signed_body(run_dir.name, trail[0]["hash"], head, None)).hex(),
              "key": other.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw).hex()}
    anchor_path(run_dir.name, trail[0]["hash"]).write_text(json.dumps(record))
    return str(record["key"])


def _edit_line(run_dir: Path, trail: list[dict[str, Any]]) -> None:
    trail[3]["data"]["summary"] = "edited"
    write_trail(run_dir, trail, rehash=False, snapshot=False)


def _delete_middle(run_dir: Path, trail: list[dict[str, Any]]) -> None:
    write_trail(run_dir, trail[:3] + trail[4:], rehash=False)


def _swap(run_dir: Path, trail: list[dict[str, Any]]) -> None:
    trail[3], trail[4] = trail[4], trail[3]
    write_trail(run_dir, trail, rehash=False, snapshot=False)


def _drop_tail(run_dir: Path, trail: list[dict[str, Any]]) -> None:
    write_trail(run_dir, trail[:-3], rehash=False)


def _drop_to_first(run_dir: Path, trail: list[dict[str, Any]]) -> None:
    write_trail(run_dir, trail[:1], rehash=False)


def _append_forged_answer(run_dir: Path, trail: list[dict[str, Any]]) -> None:
    trail.append(forged(trail, "answer_accepted", {"key": "color", "value": "blue", "tool_call_id": None}))
    write_trail(run_dir, trail)


def _append_forged_completion(run_dir: Path, trail: list[dict[str, Any]]) -> None:
    trail.append(forged(trail, "phase_completed", {"attempt": 1, "outcome": "passed", "summary": "forged",
                                                   "data": {}, "issues": [], "route": "next"}, actor="engine",
                        phase="fix"))
    write_trail(run_dir, trail)


def _rehash_whole_chain(run_dir: Path, trail: list[dict[str, Any]]) -> None:
    trail[1]["data"]["value"] = "blue"
    write_trail(run_dir, trail)


def _edit_snapshot(run_dir: Path, trail: list[dict[str, Any]]) -> None:
    state = json.loads((run_dir / "run.json").read_text())
    state.update(phase="fix", status="running", awaiting=None, pending=[], issues=[])
    state["answers"]["color"] = "blue"
    (run_dir / "run.json").write_text(json.dumps(state, indent=1, sort_keys=True))


def _delete_snapshot(run_dir: Path, trail: list[dict[str, Any]]) -> None:
    (run_dir / "run.json").unlink()


def _delete_anchor(run_dir: Path, trail: list[dict[str, Any]]) -> None:
    anchor_path(run_dir.name, trail[0]["hash"]).unlink()


def _other_runs_anchor(run_dir: Path, trail: list[dict[str, Any]]) -> None:
    record = json.loads(anchor_path(run_dir.name, trail[0]["hash"]).read_text())
    record.update(seq=record["seq"] + 1, hash="0" * 64)
    anchor_path(run_dir.name, trail[0]["hash"]).write_text(json.dumps(record))


def _head_signed_by_another_key(run_dir: Path, trail: list[dict[str, Any]]) -> None:
    trail.append(forged(trail, "note_added", {"kind": "devlog", "text": "forged"}))
    write_trail(run_dir, trail)
    sign_with(another_key(), run_dir, trail)


def _swap_the_public_key(run_dir: Path, trail: list[dict[str, Any]]) -> None:
    """Re-hash the run under a genesis that names the forger's key, and sign its head with that key."""
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    forger = another_key()
    public = forger.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw).hex()
    trail[0]["data"]["signer"] = {**trail[0]["data"]["signer"], "public_key": public}
    trail.append(forged(trail, "note_added", {"kind": "devlog", "text": "forged"}))
    write_trail(run_dir, trail)
    sign_with(forger, run_dir, trail)


def _legacy_mac_on_a_signed_run(run_dir: Path, trail: list[dict[str, Any]]) -> None:
    trail.append(forged(trail, "note_added", {"kind": "devlog", "text": "forged"}))
    write_trail(run_dir, trail)
    import hashlib
    import hmac

    path = anchor_path(run_dir.name, trail[0]["hash"])
    record = json.loads(path.read_text())
    record.update(seq=trail[-1]["seq"], hash=trail[-1]["hash"], prev=None)
    body = json.dumps([run_dir.name, trail[0]["hash"], record["seq"], record["hash"], None], separators=(",", ":"))
    record["mac"] = hmac.new(b"k" * 32, body.encode(), hashlib.sha256).hexdigest()
    path.write_text(json.dumps(record))


def _garbage_after_head(run_dir: Path, trail: list[dict[str, Any]]) -> None:
    with open(run_dir / "events.jsonl", "ab") as handle:
        handle.write(b'{"seq": 99')


def _unchained_json_line(run_dir: Path, trail: list[dict[str, Any]]) -> None:
    with open(run_dir / "events.jsonl", "ab") as handle:
        handle.write(b'{"seq": 99, "type": "note_added"}\n')


def _log_of_another_run(run_dir: Path, trail: list[dict[str, Any]]) -> None:
    other = sorted(p for p in run_dir.parent.iterdir() if p != run_dir)[0]
    shutil.copy(other / "events.jsonl", run_dir / "events.jsonl")
    shutil.copy(other / "run.json", run_dir / "run.json")


def _edit_artifact(run_dir: Path, trail: list[dict[str, Any]]) -> None:
    (run_dir / "artifacts" / "square.json").write_text('{"square": 50}\n')


STATE_DIR_TAMPERS: dict[str, tuple[Tamper, bool]] = {
    # name: (tamper, whether the engine must refuse it too; an edited artifact is audit's alone)
    "edit a line": (_edit_line, True), "delete a middle line": (_delete_middle, True), "swap two lines": (_swap, True),
    "drop the tail": (_drop_tail, True), "drop all but the first event": (_drop_to_first, True),
    "append a validly hashed forged answer": (_append_forged_answer, True),
    "append a validly hashed forged completion": (_append_forged_completion, True),
    "re-hash the whole chain and rewrite run.json": (_rehash_whole_chain, True),
    "edit run.json phase/status/pending/answers": (_edit_snapshot, True), "delete run.json": (_delete_snapshot, True),
    "delete the anchor": (_delete_anchor, True), "edit the anchor": (_other_runs_anchor, True),
    "an HMAC head on a signed run": (_legacy_mac_on_a_signed_run, True),
    "a head signed by another key": (_head_signed_by_another_key, True),
    "a swapped public key": (_swap_the_public_key, True),
    "garbage after the head": (_garbage_after_head, True), "an unchained JSON line": (_unchained_json_line, True),
    "the log of another run": (_log_of_another_run, True), "edit an artifact": (_edit_artifact, False),
}


@pytest.fixture(scope="module")
def waiting_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """Toy runs waiting for the agent in fix (color answered by a person), one per tamper, plus a spare."""
    root = tmp_path_factory.mktemp("tamper")
    target = root / "target"
    make_repo(target, {"a.txt": "hello\n", "allowed/README": "edit here\n"})
    state, store = root / "state", RunStore(root / "state")
    run_ids = []
    for _ in range(len(STATE_DIR_TAMPERS) + 1):
        run_id = engine.start("toy", {"target": str(target), "color": "red"}, store=store).run_id
        assert engine.advance(run_id, store=store).state["phase"] == "fix"
        run_ids.append(run_id)
    return state, run_ids


@pytest.mark.parametrize("name", list(STATE_DIR_TAMPERS))
def test_state_dir_tamper_is_caught(waiting_runs: tuple[Path, list[str]], name: str) -> None:
    state, run_ids = waiting_runs
    run_id = run_ids[list(STATE_DIR_TAMPERS).index(name)]
    run_dir = state / "runs" / run_id
    tamper, engine_refuses = STATE_DIR_TAMPERS[name]
    tamper(run_dir, events(state, run_id))
    audit = cli("audit", run_id, "--json", state_dir=state)
    assert audit.returncode == 1 and not json.loads(audit.stdout)["ok"], audit.stdout
    if engine_refuses:
        before = (run_dir / "events.jsonl").read_bytes()
        for args in (("advance", run_id), ("resume", run_id, "--answer", "color=blue")):
            refused = cli(*args, state_dir=state)
            assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
            assert f"orchestrator audit {run_id}" in refused.stderr
        assert (run_dir / "events.jsonl").read_bytes() == before


def _key_holder_skips_a_phase(run_dir: Path, trail: list[dict[str, Any]]) -> None:
    trail.append(forged(trail, "transition_taken", {"source": "fix", "dest": "done", "trigger": "route_next"},
                        actor="engine", phase="fix"))
    write_trail(run_dir, trail)


def _key_holder_agent_answers_human_question(run_dir: Path, trail: list[dict[str, Any]]) -> None:
    trail.insert(2, forged(trail[:2], "question_asked", {"key": "ok", "prompt": "?", "choices": None,
                                                         "answer_schema": None, "human_only": True}, actor="engine"))
    trail.insert(3, forged(trail[:3], "answer_accepted", {"key": "ok", "value": "yes", "tool_call_id": "x"},
                           actor="agent"))
    write_trail(run_dir, trail)


def _key_holder_completion_without_start(run_dir: Path, trail: list[dict[str, Any]]) -> None:
    index = next(i for i, e in enumerate(trail) if e["type"] == "phase_started")
    del trail[index]
    write_trail(run_dir, trail)


def _key_holder_late_pre_answer(run_dir: Path, trail: list[dict[str, Any]]) -> None:
    trail.append(forged(trail, "answer_accepted", {"key": "shade", "value": "dark", "tool_call_id": None}))
    write_trail(run_dir, trail)


KEY_HOLDER_FORGERIES = {
    "skip a phase (transition without a passed completion)": _key_holder_skips_a_phase,
    "an agent answers a human-only question": _key_holder_agent_answers_human_question,
    "a completion without its start": _key_holder_completion_without_start,
    "an answer to a question nobody asked": _key_holder_late_pre_answer,
}


@pytest.mark.parametrize("name", list(KEY_HOLDER_FORGERIES))
def test_forgery_with_the_key_is_caught_by_meaning(tmp_path: Path, name: str) -> None:
    target = tmp_path / "target"
    make_repo(target, {"a.txt": "hello\n", "allowed/README": "edit here\n"})
    store = RunStore(tmp_path / "state")
    run_id = engine.start("toy", {"target": str(target), "color": "red"}, store=store).run_id
    engine.advance(run_id, store=store)
    run_dir = tmp_path / "state" / "runs" / run_id
    assert cli("audit", run_id, state_dir=tmp_path / "state").returncode == 0
    KEY_HOLDER_FORGERIES[name](run_dir, events(tmp_path / "state", run_id))
    reanchor(run_dir)
    audit = json.loads(cli("audit", run_id, "--json", state_dir=tmp_path / "state").stdout)
    assert [f["check"] for f in audit["findings"]] and {f["check"] for f in audit["findings"]} == {"meaning"}, audit


def test_truncation_behind_a_witnessed_head_is_caught(tmp_path: Path) -> None:
    """Even the key holder cannot drop events a witness saw: audit --witness finds the cut."""
    target = tmp_path / "target"
    make_repo(target, {"a.txt": "hello\n", "allowed/README": "edit here\n"})
    state, store = tmp_path / "state", RunStore(tmp_path / "state")
    run_id = engine.start("toy", {"target": str(target), "color": "red"}, store=store).run_id
    engine.advance(run_id, store=store)
    witness = tmp_path / "elsewhere" / "head.json"
    witness.parent.mkdir()
    ledger = make_repo(tmp_path / "ledger", {"README": "witnessed heads\n"}).working_dir
    for spec in (str(witness), f"git:{ledger}"):
        assert cli("witness", run_id, "--to", spec, state_dir=state).returncode == 0
        assert cli("audit", run_id, "--witness", spec, state_dir=state).returncode == 0
    run_dir = state / "runs" / run_id
    write_trail(run_dir, events(state, run_id)[:-2], rehash=False)
    reanchor(run_dir)
    assert cli("audit", run_id, state_dir=state).returncode == 0  # the re-signed cut alone passes: the holder's limit
    for spec in (str(witness), f"git:{ledger}"):
        audit = json.loads(cli("audit", run_id, "--json", "--witness", spec, state_dir=state).stdout)
        assert [f["check"] for f in audit["findings"]] == ["witness"], audit


def test_copied_trail_audits_with_the_public_key_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A copy with its heads/ but no private key verifies against the signer's public key the auditor pins, and
    names whose key signed; without a pinned key audit says what the signatures prove and does not pass it."""
    target = tmp_path / "target"
    make_repo(target, {"a.txt": "hello\n", "allowed/README": "edit here\n"})
    state = tmp_path / "state"
    run_id = engine.start("toy", {"target": str(target), "color": "red"}, store=RunStore(state)).run_id
    copy = tmp_path / "copy"
    shutil.copytree(state, copy / "state")
    heads = anchor_path(run_id, events(state, run_id)[0]["hash"]).parent
    shutil.copytree(heads, copy / "anchors" / "heads")
    assert cli("key", "--export", str(copy / "signer.pub")).returncode == 0
    monkeypatch.setenv("ORCHESTRATOR_ANCHOR_DIR", str(copy / "anchors"))
    audit = cli("audit", run_id, "--json", "--key", str(copy / "signer.pub"), state_dir=copy / "state")
    result = json.loads(audit.stdout)
    assert audit.returncode == 0 and result["signed_by"].startswith("ed25519 key "), result
    assert not (copy / "anchors" / "trail.ed25519").exists()
    unpinned = json.loads(cli("audit", run_id, "--json", state_dir=copy / "state").stdout)
    assert [f["check"] for f in unpinned["findings"]] == ["key"], unpinned
