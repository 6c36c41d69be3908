"""An auditor pins the signer's public key: `audit RUN --key FILE` (or ORCHESTRATOR_TRUSTED_KEY), `--anchor-dir DIR`.

Issue 39, tried as a new user would: an auditor given a copied state dir, the signer's public key and the
signed heads had no documented way to audit against them (it set HOME to a folder holding them), and with no
`.pub` in the anchor dir `audit` said "trail intact" while trusting the key named inside the log itself. A
forger who re-hashes a run under a genesis naming their own key, and signs its heads with it, makes a log
that is consistent with the key it names: only a key the auditor pins tells it apart.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestrator import engine
from orchestrator.trail.anchor import Head, signed_body
from orchestrator.trail.store import RunStore
from tests.conftest import ROOT, make_repo
from tests.reliability_kit import events
from tests.test_reliability_tamper import another_key, write_trail


def audit(*args: str, state: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The real CLI as an auditor runs it, with only the environment given (no anchor dir of this machine)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("ORCHESTRATOR_")}
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", "audit", *args, "--state-dir", str(state)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT, env={**base, **(env or {})})


def fingerprint(public_key: str) -> str:
    """The documented fingerprint: the first 16 hex digits of the sha256 of the 32 raw public key bytes."""
    return hashlib.sha256(bytes.fromhex(public_key)).hexdigest()[:16]


def forge_under_own_key(run_dir: Path, heads_dir: Path, forger: Any) -> str:
    """What someone without the signer's key can do to a copy: edit a line, re-hash the chain under a genesis
    that names their own key, sign the whole log as one write in the log and in heads/. Their public key."""
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    public = forger.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw).hex()
    trail = events(run_dir.parent.parent, run_dir.name)
    for event in trail:
        event.pop("signed_head", None)
    trail[0]["data"]["signer"] = {**trail[0]["data"]["signer"], "public_key": public}
    answer = next(e for e in trail if e["type"] == "answer_accepted")
    answer["data"]["value"] = "green"
    write_trail(run_dir, trail)
    trail = events(run_dir.parent.parent, run_dir.name)
    head = Head(seq=trail[-1]["seq"], hash=trail[-1]["hash"])
    sig = forger.sign(signed_body(run_dir.name, trail[0]["hash"], head, None)).hex()
    trail[0]["signed_head"] = {"hash": head.hash, "seq": head.seq, "sig": sig}
    write_trail(run_dir, trail, rehash=False, snapshot=False)
    for old in heads_dir.glob(f"{run_dir.name}.*.json"):
        old.unlink()
    record = {"run_id": run_dir.name, "genesis": trail[0]["hash"], "seq": head.seq, "hash": head.hash,
              "prev": None, "sig": sig, "key": public}
    (heads_dir / f"{run_dir.name}.{trail[0]['hash'][:16]}.json").write_text(json.dumps(record))
    return public


@pytest.fixture(scope="module")
def copied(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Two toy runs signed on this machine, copied with heads/ and the exported public key; one forged in the copy."""
    root = tmp_path_factory.mktemp("pinned")
    target = root / "target"
    make_repo(target, {"a.txt": "hello\n", "allowed/README": "edit here\n"})
    store = RunStore(root / "state")
    honest, forged = (engine.start("toy", {"target": str(target), "color": "red"}, store=store).run_id
                      for _ in range(2))
    anchors = Path(os.environ["ORCHESTRATOR_ANCHOR_DIR"])
    copy = root / "copy"
    shutil.copytree(root / "state", copy / "state")
    (copy / "heads").mkdir()
    for run_id in (honest, forged):
        for head in (anchors / "heads").glob(f"{run_id}.*.json"):
            shutil.copy(head, copy / "heads" / head.name)
    signer = json.loads((anchors / "trail.ed25519.pub").read_text())
    (copy / "signer.pub").write_text(json.dumps(signer))
    forger = forge_under_own_key(copy / "state" / "runs" / forged, copy / "heads", another_key())
    return {"copy": copy, "honest": honest, "forged": forged, "signer": signer["public_key"], "forger": forger}


def test_without_a_pinned_key_audit_says_what_the_signature_proves_and_not_intact(copied) -> None:
    copy = copied["copy"]
    for run_id, key in ((copied["honest"], copied["signer"]), (copied["forged"], copied["forger"])):
        result = audit(run_id, state=copy / "state", env={"ORCHESTRATOR_ANCHOR_DIR": str(copy)})  # heads/, no .pub
        assert result.returncode == 1 and "trail intact" not in result.stdout, result.stdout + result.stderr
        assert "consistent with the key it names" in result.stdout and f"ed25519 key {fingerprint(key)}" in \
            result.stdout and key in result.stdout, result.stdout
        body = json.loads(audit(run_id, "--anchor-dir", str(copy), "--json", state=copy / "state").stdout)
        assert [f["check"] for f in body["findings"]] == ["key"] and body["pinned"] is None, body
        assert body["signer"]["key_id"] == fingerprint(key) and body["signer"]["public_key"] == key


def test_the_pinned_key_passes_the_honest_run_and_catches_the_forged_one(copied) -> None:
    copy, pub = copied["copy"], copied["copy"] / "signer.pub"
    for how in (("--key", str(pub)), ("--key", copied["signer"])):
        honest = audit(copied["honest"], *how, "--anchor-dir", str(copy), state=copy / "state")
        assert honest.returncode == 0 and "trail intact" in honest.stdout, honest.stdout + honest.stderr
        assert f"ed25519 key {fingerprint(copied['signer'])}" in honest.stdout and copied["signer"] in honest.stdout
    by_env = audit(copied["honest"], "--anchor-dir", str(copy / "heads"), state=copy / "state",
                   env={"ORCHESTRATOR_TRUSTED_KEY": str(pub)})
    assert by_env.returncode == 0 and "ORCHESTRATOR_TRUSTED_KEY" in by_env.stdout, by_env.stdout + by_env.stderr
    forged = audit(copied["forged"], "--key", str(pub), "--anchor-dir", str(copy), "--json", state=copy / "state")
    body = json.loads(forged.stdout)
    assert forged.returncode == 1 and [f["check"] for f in body["findings"]] == ["key"], body
    message = body["findings"][0]["message"]
    assert fingerprint(copied["forger"]) in message and fingerprint(copied["signer"]) in message, message


def test_audit_all_of_a_copied_state_dir_names_the_one_forged_run(copied) -> None:
    copy = copied["copy"]
    result = audit("--all", "--key", str(copy / "signer.pub"), "--anchor-dir", str(copy), state=copy / "state")
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout.splitlines()[-1] == f"2 run(s) audited: 1 intact, 1 with findings ({copied['forged']})"
    body = json.loads(audit("--all", "--key", str(copy / "signer.pub"), "--anchor-dir", str(copy), "--json",
                            state=copy / "state").stdout)
    assert {r["run_id"]: r["ok"] for r in body["runs"]} == {copied["honest"]: True, copied["forged"]: False}
    assert body["ok"] is False


def test_a_pinned_key_wins_over_another_key_in_this_machines_anchor_dir(copied, tmp_path: Path) -> None:
    """The auditor's own anchor dir (HOME) holds their own key: --key and --anchor-dir are what count."""
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    mine = tmp_path / "mine"
    mine.mkdir()
    other = another_key().public_key().public_bytes(Encoding.Raw, PublicFormat.Raw).hex()
    (mine / "trail.ed25519.pub").write_text(json.dumps({"public_key": other, "holder": "auditor@laptop"}))
    copy = copied["copy"]
    result = audit(copied["honest"], "--key", str(copy / "signer.pub"), "--anchor-dir", str(copy),
                   state=copy / "state", env={"ORCHESTRATOR_ANCHOR_DIR": str(mine)})
    assert result.returncode == 0 and "trail intact" in result.stdout, result.stdout + result.stderr
    unpinned = audit(copied["honest"], state=copy / "state", env={"ORCHESTRATOR_ANCHOR_DIR": str(mine)})
    assert unpinned.returncode == 1 and fingerprint(other) in unpinned.stdout, unpinned.stdout


def test_bad_key_input_is_one_line_and_exit_2(copied, tmp_path: Path) -> None:
    copy = copied["copy"]
    (tmp_path / "junk.pub").write_text("not a key\n")
    for args in (("--key", str(tmp_path / "missing.pub")), ("--key", str(tmp_path / "junk.pub")),
                 ("--anchor-dir", str(tmp_path / "nowhere"))):
        result = audit(copied["honest"], *args, state=copy / "state")
        assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr


@pytest.mark.parametrize("archive", ["2026-11-30-add-moe-gpu", "2026-12-04-h200-lcp"])
def test_committed_evidence_audits_with_anchor_dir_alone(archive: str) -> None:
    """Old trails (a legacy HMAC run, whose secret travelled; an Ed25519 run with its .pub) audit through the
    documented flag, without setting HOME or the anchor variable."""
    from tests.evidence import unpacked

    folder = unpacked(archive)
    result = audit("--all", "--anchor-dir", str(folder / "anchors"), "--json", state=folder)
    body = json.loads(result.stdout)
    assert result.returncode == 0 and body["ok"] and body["runs"], body

