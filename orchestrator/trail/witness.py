"""Where a witnessed head is kept: a file path, or ``git:REPO`` (ref ``refs/orchestrator/witness/<run_id>``).

A witness is a copy of a run's signed head kept where this machine cannot rewrite it silently
(another host's file, a repository pushed elsewhere). ``audit --witness`` then checks that the
trail still extends it (``inspector``).

Which head (``head_to_witness``): the newest one the trail proves, never simply the anchor
file's record. A run with in-log heads proves its last complete write's head in its own log,
signed, and that is the head: after a power loss the anchor may lag it (``writer``), and a
witness of the lagging head would let a later cut back to it pass. A write that did not land
(the anchor one write ahead, a write cut short) is no head: the repair cuts it off. A run made
before in-log heads has its heads in the anchor alone, synced before each write: its record is
witnessed when it names the log's last line. A trail with a blocking finding is refused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from orchestrator.errors import TrailCorrupt, UsageError
from orchestrator.trail.trail_io import atomic_write

GIT_PREFIX = "git:"


def witness_ref(run_id: str) -> str:
    return f"refs/orchestrator/witness/{run_id}"


def head_to_witness(run_dir: Path) -> dict[str, Any]:
    """The head record to witness, as the anchor writes one (``verify_record`` checks it); TrailCorrupt: why none."""
    from orchestrator.trail import signed_log
    from orchestrator.trail.anchor import AnchorError, Head, anchor_path, verify_record
    from orchestrator.trail.inspector import inspect_trail

    run_id = run_dir.name
    report = inspect_trail(run_dir)
    if report.blocking:
        raise _refused(run_id, report.blocking[0].message)
    events, genesis = report.events, report.events[0]["hash"]
    if report.in_log:
        write = signed_log.read_heads(events).writes[-1]
        if (bad := signed_log.bad_signature(write, events, run_id, report.signer)) is not None:
            raise _refused(run_id, bad.message)
        prev = None if write.start == 0 else Head(seq=write.start - 1, hash=events[write.start - 1]["hash"])
        return {"run_id": run_id, "genesis": genesis, "seq": write.head.seq, "hash": write.head.hash,
                "prev": prev and [prev.seq, prev.hash], "sig": write.sig, "key": report.signer["public_key"]}
    last = Head(seq=events[-1]["seq"], hash=events[-1]["hash"])
    try:
        record = json.loads(anchor_path(run_id, genesis).read_bytes())
        signed = verify_record(record, run_id, genesis, report.signer, where="the anchor")
    except (OSError, ValueError, AnchorError) as exc:
        raise _refused(run_id, f"its anchor cannot be read ({exc})") from None
    if report.keep < len(events) or report.torn or signed.head != last:
        raise _refused(run_id, f"its anchor names seq {signed.head.seq}, a write that did not land (the log ends at "
                               f"seq {last.seq}); the next writing command repairs it")
    return record


def _refused(run_id: str, what: str) -> TrailCorrupt:
    return TrailCorrupt(f"run {run_id}: {what}; no head is witnessed: run `orchestrator audit {run_id}`")


def write_witness(spec: str, run_id: str, record: bytes) -> str:
    """Store ``record`` at ``spec``; returns where, in words."""
    if spec.startswith(GIT_PREFIX):
        repo = _repo(spec)
        from io import BytesIO

        from gitdb import IStream

        blob = repo.odb.store(IStream("blob", len(record), BytesIO(record))).hexsha
        repo.git.update_ref(witness_ref(run_id), blob.decode() if isinstance(blob, bytes) else blob)
        return f"{witness_ref(run_id)} of {repo.working_dir}"
    path = Path(spec)
    if not path.parent.is_dir():
        raise UsageError(f"{path.parent} is not a directory")
    atomic_write(path, record)
    return str(path)


def read_witness(spec: str, run_id: str) -> tuple[str, bytes | None]:
    """(where, the witnessed record or None when there is none to read)."""
    if spec.startswith(GIT_PREFIX):
        import git

        repo = _repo(spec)
        try:
            return f"{witness_ref(run_id)} of {repo.working_dir}", repo.git.cat_file(
                "blob", witness_ref(run_id), stdout_as_string=False)
        except git.GitCommandError:
            return f"{witness_ref(run_id)} of {repo.working_dir}", None
    try:
        return spec, Path(spec).read_bytes()
    except OSError:
        return spec, None


def _repo(spec: str):  # noqa: ANN202 (git.Repo, imported lazily)
    import git

    try:
        return git.Repo(spec[len(GIT_PREFIX):])
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        raise UsageError(f"{spec[len(GIT_PREFIX):]!r} is not a git repository") from None
