"""Proven fixes from the trails on disk, on the ``keys`` toy workflow (real git repos, real tools, real CLI).

Issue 40: the same experiment-folder fix was written from scratch in 3 of 5 runs, while the proof that it
cleared the finding sat in earlier trails nothing read. Here run A clears two findings with two edits
(one through the tools, one outside them) and leaves the phase; run B, another "model" (another layer
number) on the same content, raises one of them, is offered exactly the edit that cleared it with run
A's event seqs, applies it through MCP in one call and is done; the fix then has two proving runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest

from orchestrator import engine
from orchestrator.agent.tools import call_tool
from orchestrator.trail.store import RunStore
from tests.conftest import TOY, cli, make_repo
from tests.test_agent_tools import Caller

KEYS_REF = f"{TOY},keys=tests.toyflow.keys:WORKFLOW"
CONFIG = "allowed/config.txt"
ALPHA = ("gamma = 1\n", "gamma = 1\nalpha = 1\n")


@pytest.fixture
def keys_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCHESTRATOR_WORKFLOWS", KEYS_REF)


def content_repo(path: Path, *, core: str = "core\n") -> Path:
    make_repo(path, {CONFIG: "gamma = 1\n", "core.txt": core})
    return path


def checked(caller: Caller, target: Path, **options: Any) -> str:
    run_id = engine.start("keys", {"target": str(target), **options}, store=caller.store).run_id
    assert caller("advance", run_id=run_id).data["awaiting"] == "agent"
    return run_id


def fixes_json(state_dir: Path) -> dict[str, Any]:
    done = cli("fixes", "--json", state_dir=state_dir)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def events_of(store: RunStore, run_id: str, kind: str) -> list[dict[str, Any]]:
    return [e for e in store.read_events(run_id) if e["type"] == kind]


def run_a(caller: Caller, tmp_path: Path) -> str:
    """Layer 3 needs alpha and beta: alpha through edit_file, the phase checks, beta outside the tools."""
    target = content_repo(tmp_path / "a")
    run_id = checked(caller, target, need="alpha,beta", layer=3)
    assert caller("edit_file", run_id=run_id, path=CONFIG, old_string=ALPHA[0], new_string=ALPHA[1]).status == "ok"
    assert [i["message"] for i in caller("advance", run_id=run_id).data["issues"]] == [
        "model.layers.3.config lacks key 'beta'"]
    assert fixes_json(caller.store.state_dir)["fixes"] == []  # alpha is gone, but run A has not left the phase
    (target / CONFIG).write_text(ALPHA[1] + "beta = 2\n")
    assert caller("advance", run_id=run_id).data["status"] == "done"
    return run_id


def test_the_edit_that_cleared_a_finding_is_offered_to_the_next_model_and_applied_in_one_call(
        keys_env: None, tmp_path: Path) -> None:
    store = RunStore(tmp_path / "state")
    caller = Caller(store)
    a = run_a(caller, tmp_path)
    known = {f["findings"][0]["subject"]: f for f in fixes_json(store.state_dir)["fixes"]}
    assert set(known) == {"model.layers.N.config lacks key 'alpha'", "model.layers.N.config lacks key 'beta'"}
    alpha = known["model.layers.N.config lacks key 'alpha'"]
    assert [p["by"] for p in alpha["proofs"]] == [["edit_file"]]
    # beta was raised before the alpha edit too: what cleared it is both edits since, combined and offered whole
    assert [p["by"] for p in known["model.layers.N.config lacks key 'beta'"]["proofs"]] == [["edit_file", "outside"]]
    assert_evidence_holds(store, a, alpha["proofs"][0])

    b = checked(caller, content_repo(tmp_path / "b"), need="alpha", layer=1)
    [offered] = events_of(store, b, "fix_offered")
    assert offered["data"]["offer"] == alpha["offer"] and offered["data"]["applies"]
    assert [p["run_id"] for p in offered["data"]["proofs"]] == [a]
    from orchestrator.agent.driver import render_system_prompt
    from orchestrator.fix_index import offer_views

    views = offer_views(store.runs_dir, store.read_state(b), store.read_events(b))
    prompt = render_system_prompt(store.read_state(b), views)
    assert alpha["offer"] in prompt and a in prompt and "apply_fix" in prompt
    explained, applied, advanced = anyio.run(explain_apply_advance, store, b, alpha["offer"])
    [offer] = explained["data"]["fix_offers"]
    assert offer["proven_by"][0]["run_id"] == a and offer["applies_cleanly"] and "+alpha = 1" in offer["diff"]
    assert [i["fix_offers"] for i in explained["data"]["issues"]] == [[alpha["offer"]]]  # the finding offers it
    assert any(alpha["offer"] in step for step in explained["data"]["next_steps"])
    assert applied["status"] == "ok" and applied["data"]["proven_by"] == a
    assert advanced["data"]["status"] == "done"
    [edit] = events_of(store, b, "edit_recorded")
    assert (edit["data"]["by"], edit["data"]["tool"], edit["actor"]) == ("tool", "apply_fix", "agent")
    known_now = fixes_json(store.state_dir)
    [proven] = [f for f in known_now["fixes"] if f["offer"] == alpha["offer"]]
    assert [p["run_id"] for p in proven["proofs"]] == [a, b], json.dumps(known_now)
    for run_id in (a, b):
        audit = cli("audit", run_id, "--schema", "--json", state_dir=store.state_dir)
        assert audit.returncode == 0, audit.stdout


async def explain_apply_advance(store: RunStore, run_id: str, offer: str) -> tuple[dict, dict, dict]:
    """An MCP client's three calls: explain, apply_fix, advance."""
    from mcp import Client

    from orchestrator.agent.mcp_server import build_server

    async with Client(build_server(store)) as client:
        answers = []
        for tool, extra in (("explain", {}), ("apply_fix", {"offer": offer}), ("advance", {})):
            result = await client.call_tool(tool, {"run_id": run_id, **extra})
            answers.append(json.loads(result.content[0].text))
        return answers[0], answers[1], answers[2]


def assert_evidence_holds(store: RunStore, run_id: str, proof: dict[str, Any]) -> None:
    """Each seq the proof cites is the event it says, in the proving run's own trail."""
    events = store.read_events(run_id)
    raised, gone = events[proof["raised_seq"]], events[proof["completed_seq"]]
    assert raised["type"] == gone["type"] == "phase_completed"
    assert "alpha" in json.dumps(raised["data"]["issues"]) and "alpha" not in json.dumps(gone["data"]["issues"])
    assert all(events[s]["type"] == "edit_recorded" and events[s]["data"]["tool"] == "edit_file"
               for s in proof["edit_seqs"])
    assert events[proof["cleared_seq"]]["type"] == "findings_cleared"
    left = events[proof["passed_seq"]]
    assert left["type"] == "transition_taken" and left["data"]["source"] == "check"


def test_no_offer_on_other_content_or_for_another_subject(keys_env: None, tmp_path: Path) -> None:
    store = RunStore(tmp_path / "state")
    caller = Caller(store)
    run_a(caller, tmp_path)
    other_content = checked(caller, content_repo(tmp_path / "c", core="another torchtitan\n"), need="alpha")
    other_subject = checked(caller, content_repo(tmp_path / "d"), need="delta")
    for run_id in (other_content, other_subject):
        assert events_of(store, run_id, "fix_offered") == []
        assert caller("explain", run_id=run_id).data["fix_offers"] == []
    refused = caller("apply_fix", run_id=other_subject, offer="fix-000000000000")
    assert refused.status == "refused" and refused.message.startswith("fix NOT applied: no offer 'fix-000000000000'")


def test_an_offer_that_no_longer_applies_is_refused_and_its_diff_stays_readable(
        keys_env: None, tmp_path: Path) -> None:
    store = RunStore(tmp_path / "state")
    caller = Caller(store)
    run_a(caller, tmp_path)
    target = content_repo(tmp_path / "b")
    b = checked(caller, target, need="alpha")
    [offered] = events_of(store, b, "fix_offered")
    caller("edit_file", run_id=b, path=CONFIG, old_string="gamma = 1", new_string="gamma = 2")
    [offer] = caller("explain", run_id=b).data["fix_offers"]
    assert not offer["applies_cleanly"] and "does not apply" in offer["apply_check"]
    refused = caller("apply_fix", run_id=b, offer=offer["offer"])
    assert refused.status == "refused"
    assert refused.message.startswith(f"fix NOT applied: offer {offer['offer']} does not apply cleanly here")
    assert offered["data"]["diff"] in refused.message and (target / CONFIG).read_text() == "gamma = 2\n"
    diff = call_tool("read_artifact", {"run_id": b, "name": offered["data"]["diff"]}, store=store, call_id="read")
    assert diff.status == "ok" and "+alpha = 1" in diff.text
    acted = [e["data"] for e in events_of(store, b, "agent_acted") if e["data"]["tool"] == "apply_fix"]
    assert [a["outcome"].split(":")[0] for a in acted] == ["refused"] and "fix NOT applied" in acted[0]["outcome"]


def test_a_proving_diff_edited_after_the_run_proves_nothing(keys_env: None, tmp_path: Path) -> None:
    store = RunStore(tmp_path / "state")
    caller = Caller(store)
    a = run_a(caller, tmp_path)
    [first, _] = events_of(store, a, "findings_cleared")
    diff = store.run_dir(a) / "artifacts" / first["data"]["diff"]
    diff.write_text(diff.read_text().replace("+alpha = 1", "+alpha = 1\n+import os; os.system('true')"))
    listed = fixes_json(store.state_dir)
    assert "alpha" not in json.dumps(listed["fixes"])
    assert listed["skipped"] == [{"run_id": a, "reason": f"the diff {first['data']['diff']} of seq {first['seq']} "
                                                           "is missing or differs from its sha256"}]
    b = checked(caller, content_repo(tmp_path / "b"), need="alpha")
    assert events_of(store, b, "fix_offered") == []


def test_a_subject_masks_where_a_finding_is_not_what_it_names() -> None:
    from orchestrator.fixes import finding_subject

    def subject(message: str) -> str:
        return finding_subject(message, target="/state/ws/tt-98abbd")

    here = "maps model.layers.3.mlp.expert_bias (KL 1.5e-06) in /state/ws/tt-98abbd/x.py at 27083a8e1"
    assert subject(here) == subject("maps model.layers.1.mlp.expert_bias (KL 2e-05) in x.py at 5f0c1d2e")
    assert subject("Qwen3MoeSparseMoeBlock has no q_norm") != subject("Qwen2MoeSparseMoeBlock has no q_norm")
    assert subject("unsharded: ['layers.0.self_attn.q_gate_proj']") != subject("unsharded: ['layers.0.g_proj']")


def test_a_finding_a_person_waived_is_not_proven_cleared_by_the_edits_beside_it(keys_env: None, tmp_path: Path) -> None:
    """The blind trial's BEAM: a router finding was waived while an unrelated edit cleared another finding at the
    same completion, and ``fixes`` listed that edit as the proven fix for the waived router finding too."""
    store = RunStore(tmp_path / "state")
    caller = Caller(store)
    run_id = checked(caller, content_repo(tmp_path / "a"), need="alpha,opt_x", layer=3)
    assert caller("edit_file", run_id=run_id, path=CONFIG, old_string=ALPHA[0], new_string=ALPHA[1]).status == "ok"
    waived = cli("resume", run_id, "--waive", "optional_key_missing", "--reason", "not needed for this model",
                 state_dir=store.state_dir)
    assert waived.returncode == 0, waived.stderr
    assert store.read_state(run_id)["status"] == "done"
    [cleared] = events_of(store, run_id, "findings_cleared")
    assert [c["code"] for c in cleared["data"]["cleared"]] == ["key_missing"]
    assert [[f["code"] for f in fix["findings"]] for fix in fixes_json(store.state_dir)["fixes"]] == [["key_missing"]]
    shown = cli("show", run_id, state_dir=store.state_dir).stdout  # an auditor read this waiver as a start option
    line = next(ln for ln in shown.splitlines() if "waive:check:optional_key_missing" in ln and "seq " in ln)
    assert "a waiver (no question asks for one)" in line and "start option" not in line, line
