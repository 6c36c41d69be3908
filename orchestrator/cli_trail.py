"""CLI commands of the trail: ``audit``, ``witness`` and ``key`` (the public half of the signing key)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import click

from orchestrator.errors import EXIT_FAILED, EXIT_OK, OrchestratorError, UsageError


def register(main: click.Group, command: Callable) -> None:
    @command(main, "audit")
    @click.argument("run_id")
    @click.option("--schema/--no-schema", default=False, show_default=True,
                  help="Also validate every event against its pydantic model (slow on long trails).")
    @click.option("--no-anchor", is_flag=True, help="Skip the signed head (a copy whose heads/ did not travel).")
    @click.option("--witness", "witnesses", multiple=True,
                  help="A head written by `orchestrator witness` (FILE or git:REPO); the trail must extend it "
                       "(repeatable).")
    def audit_cmd(settings: Any, run_id: str, schema: bool, no_anchor: bool, witnesses: tuple[str, ...]) -> int:
        """Verify RUN's trail: hash chain, anchor, meaning, run.json, artifacts, workflow rules (and schema)."""
        from orchestrator.render import emit_json
        from orchestrator.trail.audit import audit_trail
        from orchestrator.trail.witness import read_witness
        from orchestrator.workflow import load_workflow

        store = settings.store()
        run_dir = store.run_dir(run_id)
        workflow = _workflow_for(store, run_id, load_workflow)
        rules = dict(workflow.rules) if workflow is not None else {}
        audit = audit_trail(run_dir, rules=rules, schema=schema, workflow=workflow, anchor=not no_anchor,
                            witnesses=tuple(read_witness(w, run_id) for w in witnesses))
        findings = audit.findings
        if settings.as_json:
            emit_json({"run_id": run_id, "ok": not findings, "signed_by": audit.signed_by, "notes": audit.notes,
                       "findings": [{"seq": f.seq, "check": f.check, "message": f.message} for f in findings]})
        elif findings:
            for f in findings:
                print(f"seq {f.seq if f.seq is not None else '-':>6}  {f.check:18} {f.message}")
        else:
            checked = ["chain"] + ["schema"] * schema + ["anchor"] * (not no_anchor)
            checked += ["meaning"] * (workflow is not None) + ["witness"] * bool(witnesses)
            print(f"{run_id}: trail intact ({', '.join(checked + ['run.json', 'artifacts', 'rules'])})"
                  + (f"; head signed by {audit.signed_by}" if audit.signed_by else ""))
        for note in audit.notes:
            print(f"note: {note}")
        return EXIT_FAILED if findings else EXIT_OK


    def _workflow_for(store: Any, run_id: str, load_workflow: Callable) -> Any:
        """The run's workflow, if the trail's first line names a known one (else None: no meaning checks)."""
        try:
            return load_workflow(store.read_first_event(run_id)["data"]["workflow"])
        except (OrchestratorError, KeyError, IndexError, TypeError):
            return None

    @command(main, "witness")
    @click.argument("run_id")
    @click.option("--to", "to", required=True,
                  help="FILE, or git:REPO (ref refs/orchestrator/witness/RUN), somewhere this machine cannot rewrite.")
    def witness_cmd(settings: Any, run_id: str, to: str) -> int:
        """Copy RUN's newest signed head (the one its log proves) out; `audit --witness` checks the trail extends it."""
        from orchestrator.trail.witness import head_to_witness, write_witness

        record = head_to_witness(settings.store().run_dir(run_id))
        where = write_witness(to, run_id, json.dumps(record, indent=1).encode() + b"\n")
        print(f"{run_id}: head seq {record['seq']} witnessed in {where}")
        return EXIT_OK

    @command(main, "key")
    @click.option("--export", "export", type=click.Path(dir_okay=False, path_type=Path), default=None,
                  help="Also write the public key record to this file.")
    def key_cmd(settings: Any, export: Path | None) -> int:
        """Show (made on first use) the public key that signs this machine's trails; the private key stays put."""
        from orchestrator.trail.signing import anchor_dir, describe, key_id, own_signer

        signer = own_signer(create=True)
        assert signer is not None
        if export is not None:
            export.write_text(json.dumps(signer, indent=1) + "\n")
        if settings.as_json:
            print(json.dumps({**signer, "key_id": key_id(signer["public_key"]), "anchor_dir": str(anchor_dir())}))
        else:
            print(f"{describe(signer)}\npublic key {signer['public_key']}\nkept in {anchor_dir()}")
        return EXIT_OK


def _workflow_for(store: Any, run_id: str, load_workflow: Callable) -> Any:
    """The run's workflow, if the trail's first line names a known one (else None: no meaning checks)."""
    try:
        return load_workflow(store.read_first_event(run_id)["data"]["workflow"])
    except (OrchestratorError, KeyError, IndexError, TypeError):
        return None
