"""CLI commands of the trail: ``audit``, ``witness`` and ``key`` (the public half of the signing key)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import click

from orchestrator.errors import EXIT_FAILED, EXIT_OK, OrchestratorError, UsageError


def register(main: click.Group, command: Callable) -> None:
    @command(main, "audit")
    @click.argument("run_id", required=False)
    @click.option("--all", "all_runs", is_flag=True, help="Audit every run of the state dir (exit 1 if any has a "
                                                          "finding).")
    @click.option("--schema/--no-schema", default=False, show_default=True,
                  help="Also validate every event against its pydantic model (slow on long trails).")
    @click.option("--key", "key", default=None, metavar="FILE|HEX",
                  help="The signer's public key you pin: a trail.ed25519.pub record (`orchestrator key --export`) "
                       "or its 64 hex digits (env ORCHESTRATOR_TRUSTED_KEY; else the anchor dir's trail.ed25519.pub). "
                       "Without one, audit says what the signatures prove and exits 1.")
    @click.option("--anchor-dir", "anchor_dir", default=None, metavar="DIR",
                  help="Read the signed heads (and any trail.ed25519.pub) from DIR, a folder holding heads/ or heads/ "
                       "itself, instead of the anchor dir (env ORCHESTRATOR_ANCHOR_DIR).")
    @click.option("--no-anchor", is_flag=True, help="Skip the signed head (a copy whose heads/ did not travel).")
    @click.option("--witness", "witnesses", multiple=True,
                  help="A head written by `orchestrator witness` (FILE or git:REPO); the trail must extend it "
                       "(repeatable).")
    def audit_cmd(settings: Any, run_id: str | None, all_runs: bool, schema: bool, key: str | None,
                  anchor_dir: str | None, no_anchor: bool, witnesses: tuple[str, ...]) -> int:
        """Verify RUN's trail (or --all runs): hash chain, signatures against the key you pin, anchor, meaning,
        run.json, artifacts, workflow rules (and schema); say who acted."""
        from orchestrator.render import emit_json

        store = settings.store()
        if bool(run_id) == all_runs:
            raise UsageError("audit takes one RUN or --all (every run of the state dir)")
        run_ids = store.list_run_ids() if all_runs else [run_id]
        payloads = []
        with _reading_from(anchor_dir):
            pin = _pin(key)
            for one in run_ids:
                audit, checked = _audit_one(store, one, pin=pin, schema=schema, anchor=not no_anchor,
                                            witnesses=witnesses)
                payloads.append(audit_payload(one, audit, pin))
                if not settings.as_json:
                    print(audit_text(one, audit, pin=pin, checked=checked) + ("\n" if all_runs else ""))
        failed = [p["run_id"] for p in payloads if not p["ok"]]
        if settings.as_json:
            emit_json({"runs": payloads, "ok": not failed} if all_runs else payloads[0])
        elif all_runs:
            print(f"{len(payloads)} run(s) audited: {len(payloads) - len(failed)} intact, {len(failed)} with "
                  f"findings" + (f" ({', '.join(failed)})" if failed else ""))
        return EXIT_FAILED if failed else EXIT_OK

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
            print(json.dumps({**signer, "key_id": key_id(signer["public_key"]), "fingerprint": describe(signer),
                              "anchor_dir": str(anchor_dir())}))
        else:
            print(f"{describe(signer)}\npublic key {signer['public_key']}\nkept in {anchor_dir()}\n(the fingerprint "
                  "is the first 16 hex digits of the sha256 of the 32 raw public key bytes)")
        return EXIT_OK


def _workflow_for(store: Any, run_id: str, load_workflow: Callable) -> Any:
    """The run's workflow, if the trail's first line names a known one (else None: no meaning checks)."""
    try:
        return load_workflow(store.read_first_event(run_id)["data"]["workflow"])
    except (OrchestratorError, KeyError, IndexError, TypeError):
        return None


def _reading_from(folder: str | None) -> Any:
    """``--anchor-dir DIR``: keys and heads are read from DIR for the block; without it, from the anchor dir."""
    import contextlib

    from orchestrator.trail.signing import reading_from

    if folder is None:
        return contextlib.nullcontext()
    if not Path(folder).is_dir():
        raise UsageError(f"--anchor-dir {folder}: not a directory (give the folder holding heads/, or heads/ itself)")
    return reading_from(Path(folder))


def _pin(key: str | None) -> Any:
    from orchestrator.trail.pinning import pinned_key
    from orchestrator.trail.signing import AnchorError

    try:
        return pinned_key(key)
    except AnchorError as exc:
        raise UsageError(str(exc)) from None


def _audit_one(store: Any, run_id: str, *, pin: Any, schema: bool, anchor: bool,
               witnesses: tuple[str, ...]) -> tuple[Any, list[str]]:
    """One run's audit against ``pin``, and the names of the checks it ran."""
    from orchestrator.trail.audit import audit_trail
    from orchestrator.trail.witness import read_witness
    from orchestrator.workflow import load_workflow

    workflow = _workflow_for(store, run_id, load_workflow)
    audit = audit_trail(store.run_dir(run_id), rules=dict(workflow.rules) if workflow is not None else {},
                        schema=schema, workflow=workflow, anchor=anchor, check_pin=True, pin=pin,
                        witnesses=tuple(read_witness(w, run_id) for w in witnesses))
    checked = ["chain"] + ["signatures"] * (audit.signer is not None) + ["schema"] * schema + ["anchor"] * anchor
    checked += ["meaning"] * (workflow is not None) + ["witness"] * bool(witnesses)
    return audit, checked + ["run.json", "artifacts", "rules"]


def audit_payload(run_id: str, audit: Any, pin: Any) -> dict[str, Any]:
    """One run's audit as ``--json`` gives it."""
    from orchestrator.trail.signing import describe, key_id

    signer = audit.signer and {**audit.signer, "key_id": key_id(audit.signer["public_key"]),
                               "fingerprint": describe(audit.signer)}
    pinned = pin and {"source": pin.source, "public_key": pin.public_key, "holder": pin.holder,
                      "key_id": key_id(pin.public_key)}
    return {"run_id": run_id, "ok": not audit.findings, "signed_by": audit.signed_by, "signer": signer,
            "pinned": pinned, "notes": audit.notes, "actors": audit.actors,
            "findings": [{"seq": f.seq, "check": f.check, "message": f.message} for f in audit.findings]}


def audit_text(run_id: str, audit: Any, *, pin: Any, checked: list[str]) -> str:
    """The findings, the verdict, the notes and who acted, as a person reads them."""
    from orchestrator.show import seqs_text

    lines = [f"seq {f.seq if f.seq is not None else '-':>6}  {f.check:18} {f.message}" for f in audit.findings]
    lines.append(_verdict(run_id, audit, pin=pin, checked=checked))
    lines += [f"note: {note}" for note in audit.notes]
    acted = audit.actors
    if acted:
        lines.append("acted (as the process that wrote each act said of itself: self-reported, not authenticated; "
                     f"`orchestrator show {run_id}` lists every act):")
        lines += [f"  {row['label']}: {len(row['seqs'])} act(s), seq {seqs_text(row['seqs'])}" for row in acted]
    return "\n".join(lines)


def _verdict(run_id: str, audit: Any, *, pin: Any, checked: list[str]) -> str:
    from orchestrator.trail.signing import describe

    if audit.findings:
        return f"{run_id}: {len(audit.findings)} finding(s); the trail is not shown intact"
    line = f"{run_id}: trail intact ({', '.join(checked)})"
    if audit.signer is not None and pin is not None:
        line += (f"; head signed by {describe(audit.signer)} (public key {audit.signer['public_key']}), the key "
                 f"pinned by {pin.source}")
    elif audit.signed_by:
        line += f"; head signed by {audit.signed_by}"
    return line + ("" if "anchor" in checked else "; the signed head outside the state dir was not checked "
                                                  "(--no-anchor)")
