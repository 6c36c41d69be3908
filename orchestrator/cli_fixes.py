"""``orchestrator fixes``: the proven fixes the state dir's trails show, with the runs that prove each.

Registered by ``orchestrator.cli._register_plugins``. The list is read from the trails (``fix_index``),
so it is the same list a run's offers come from.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import click

from orchestrator.errors import EXIT_OK


def register(main: click.Group, command: Callable[..., Callable]) -> None:
    @command(main, "fixes")
    def fixes_cmd(settings: Any) -> int:
        """List the proven fixes of the state dir: each finding an edit cleared, the diff, the runs that prove it."""
        from orchestrator.fix_index import known_fixes
        from orchestrator.render import emit_json

        store = settings.store()
        fixes, skipped = known_fixes(store.runs_dir)
        if settings.as_json:
            emit_json({"fixes": [fix_view(f, state_dir=store.state_dir) for f in fixes], "skipped": skipped})
        else:
            print(fixes_text(fixes, skipped, state_dir=store.state_dir))
        return EXIT_OK


def fix_view(fix: Any, *, state_dir: Path) -> dict[str, Any]:
    """One known fix as ``fixes --json`` prints it (``diff``: the proving diff's path in the state dir)."""
    return {"offer": fix.offer, "findings": [{"code": c, "subject": s} for c, s in fix.findings],
            "base_tree": fix.base_tree, "files": list(fix.files), "diff_sha256": fix.diff_sha256,
            "diff": fix.source.relative_to(state_dir).as_posix(), "proofs": list(fix.proofs)}


def fixes_text(fixes: list[Any], skipped: list[dict[str, str]], *, state_dir: Path) -> str:
    lines = [] if fixes else ["no proven fixes yet: a fix is known once a run's edit clears a finding and the run "
                              "leaves that phase"]
    for fix in fixes:
        codes = ", ".join(sorted({c for c, _ in fix.findings}))
        lines.append(f"{fix.offer}  {codes}  (base tree {fix.base_tree[:12]})")
        lines += [f"  subject  {subject}" for _, subject in fix.findings]
        lines.append(f"  files    {', '.join(fix.files)}")
        lines.append(f"  diff     {fix.source.relative_to(state_dir).as_posix()}")
        for p in fix.proofs:
            lines.append(f"  proven by {p['run_id']}: phase {p['phase']}, raised seq {p['raised_seq']}, edits "
                         f"{', '.join(map(str, p['edit_seqs']))} by {', '.join(p['by'])}, gone at seq "
                         f"{p['completed_seq']}, phase left at seq {p['passed_seq']} (record seq {p['cleared_seq']})")
    lines += [f"not read: {s['run_id']}: {s['reason']}" for s in skipped]
    return "\n".join(lines)
