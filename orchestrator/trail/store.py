"""The run directory: the only code that opens events.jsonl, run.json and artifacts/.

Layout: ``<state>/runs/<run_id>/{events.jsonl, run.json, artifacts/, .lock}``.
Writers hold the run's file lock (``RunStore.open_run``), which verifies the log first
(``trail.verify`` on ``trail.inspector``'s report) and hands out a ``writer.OpenRun``: it signs
the new head (outside the state dir, ``trail.anchor``, and on the write's first line,
``trail.signed_log``), then appends and syncs the lines before the engine acts on them.
Readers (``read_state``, ``read_events``) never take the lock and never verify; they import
only this module, ``trail_io`` and (for a run.json behind the log) the snapshot fold: no
signing, no hashing, so ``status`` starts fast. A reader that finds run.json behind the log
replays the log, so a crash between the two loses nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
from pathlib import Path
from typing import Any, Iterator

from orchestrator.errors import RunBusy, RunNotFound, TrailCorrupt, UsageError
from orchestrator.trail.trail_io import ARTIFACTS, EVENTS, SNAPSHOT, atomic_write, last_line, parse_trail, resolved_path

def new_run_id(workflow: str) -> str:
    import secrets
    from datetime import datetime, timezone

    return f"{workflow}-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")


class RunStore:
    """All runs under one state directory.

    ``who``: actor ("human", "agent") -> the ``who`` record its events carry (``identity``); an actor left out
    gets this process's own record when it first writes.
    """

    def __init__(self, state_dir: Path, *, who: dict[str, dict[str, Any]] | None = None) -> None:
        self.state_dir = Path(state_dir).absolute()
        self.runs_dir = self.state_dir / "runs"
        self.who = dict(who or {})
        self._local = threading.local()

    def acting(self, **who: dict[str, Any]) -> "RunStore":
        """The same runs, written by someone else: ``store.acting(agent=identity.mcp_client(...))``."""
        return RunStore(self.state_dir, who={**self.who, **who})

    def record_path(self, path: str | Path) -> str:
        """A path as the trail records it: relative to the state dir when it lies inside it, else absolute."""
        resolved = Path(path).resolve()
        try:
            return resolved.relative_to(self.state_dir.resolve()).as_posix()
        except ValueError:
            return str(resolved)


    def check_writable(self) -> None:
        """Refuse early when the state dir could not be made or written; creates nothing."""
        probe = self.runs_dir
        while not probe.exists():
            if probe.parent == probe:
                break
            probe = probe.parent
        if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
            raise UsageError(f"state dir {self.state_dir} is not writable ({probe} is not a writable directory); "
                             "pass --state-dir or set ORCHESTRATOR_STATE_DIR")

    def ensure_writable(self) -> None:
        """Create the state dir if needed; refuse with a clear message when it cannot be written."""
        import tempfile

        try:
            self.runs_dir.mkdir(parents=True, exist_ok=True)
            probe = tempfile.NamedTemporaryFile(dir=self.runs_dir, prefix=".probe-")
            probe.close()
        except OSError as exc:
            raise UsageError(f"state dir {self.state_dir} is not writable ({exc.strerror}); "
                             "pass --state-dir or set ORCHESTRATOR_STATE_DIR") from None

    def run_dir(self, run_id: str) -> Path:
        if not isinstance(run_id, str) or not RUN_ID.fullmatch(run_id):
            shown = run_id if len(str(run_id)) <= 80 else f"{str(run_id)[:80]}..."
            raise RunNotFound(f"no run {shown!r}: run ids are 1-200 letters, digits, '.', '_' or '-'")
        path = self.runs_dir / run_id
        if not path.is_dir():
            raise RunNotFound(f"no run {run_id!r} in {self.runs_dir}; `orchestrator list` shows the runs")
        return path

    def create_run(self, run_id: str, started: Any, *, actor: str = "engine") -> None:
        """Create the run directory with its first event, all or nothing (rename at the end).

        ``actor``: who starts it (the engine's ``start`` passes the person or agent who asked)."""
        import tempfile

        from orchestrator.trail.signing import own_signer
        from orchestrator.trail.snapshot import empty_state
        from orchestrator.trail.writer import OpenRun

        self.ensure_writable()
        tmp = Path(tempfile.mkdtemp(dir=self.runs_dir, prefix=f".new-{run_id}-"))
        try:
            (tmp / ARTIFACTS).mkdir()
            (tmp / EVENTS).touch()
            signer = own_signer(create=True)
            run = OpenRun(tmp, empty_state(run_id), signer=signer, in_log=True, who=self.who)
            run.run_id = run_id
            run.append(started.model_copy(update={"signer": signer, "heads": "in_log"}), actor=actor)
            run.close()
            os.replace(tmp, self.runs_dir / run_id)
        except BaseException:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
            raise

    @contextlib.contextmanager
    def open_run(self, run_id: str, *, wait_s: float = 0.0) -> Iterator[Any]:
        """Lock the run (RunBusy after ``wait_s``), verify its trail, yield its ``writer.OpenRun``, flush on exit.

        Re-entrant within a thread: an agent tool call holds the run while the engine code it
        calls opens it again, so the call and its record land under one lock.
        """
        import filelock

        from orchestrator.trail.verify import verify_for_writing
        from orchestrator.trail.writer import open_verified

        held = self._held()
        if run_id in held:
            yield held[run_id]
            return
        run_dir = self.run_dir(run_id)
        lock = filelock.FileLock(run_dir / ".lock", timeout=wait_s)
        try:
            lock.acquire()
        except filelock.Timeout:
            raise RunBusy(f"run {run_id} is busy: another orchestrator process is changing it; "
                          "wait for it to finish (reads such as status never block)") from None
        try:
            run = open_verified(run_dir, verify_for_writing(run_dir), who=self.who)
            held[run_id] = run
            try:
                yield run
            finally:
                held.pop(run_id, None)
                run.close()
        finally:
            lock.release()

    def busy(self, run_id: str) -> bool:
        """Whether another process (an advance, an acting tool call) holds the run's lock right now."""
        import filelock

        if run_id in self._held():
            return False
        lock = filelock.FileLock(self.run_dir(run_id) / ".lock", timeout=0)
        try:
            lock.acquire()
        except filelock.Timeout:
            return True
        lock.release()
        return False

    def _held(self) -> dict[str, Any]:
        if not hasattr(self._local, "held"):
            self._local.held = {}
        return self._local.held

    def read_state(self, run_id: str) -> dict[str, Any]:
        """The run's snapshot without locking: run.json when it is at the log's head, else a replay."""
        run_dir = self.run_dir(run_id)
        try:
            state = json.loads((run_dir / SNAPSHOT).read_bytes())
        except (OSError, ValueError):
            state = None
        line = last_line(run_dir / EVENTS)
        if line is None:
            raise TrailCorrupt(f"{run_dir / EVENTS} has no complete event; run `orchestrator audit {run_id}`")
        try:
            head = json.loads(line)
            current = isinstance(state, dict) and (state.get("last_seq"), state.get("chain_head")) == (
                head["seq"], head["hash"])
        except (ValueError, KeyError, TypeError):
            raise TrailCorrupt(f"{run_dir / EVENTS} has a malformed last line; "
                               f"run `orchestrator audit {run_id}`") from None
        if not current:
            from orchestrator.trail.snapshot import replay

            try:
                state = replay(parse_trail(run_dir / EVENTS), run_id=run_id)
            except (KeyError, TypeError, AttributeError):
                raise TrailCorrupt(f"{run_dir / EVENTS} does not replay; run `orchestrator audit {run_id}`") from None
        if isinstance(state.get("target"), str):
            state["target"] = resolved_path(state["target"], self.state_dir)
        return state

    def read_events(self, run_id: str) -> list[dict[str, Any]]:
        return parse_trail(self.run_dir(run_id) / EVENTS)

    def read_first_event(self, run_id: str) -> dict[str, Any]:
        """The run_started line alone (cheap even for a long trail)."""
        path = self.run_dir(run_id) / EVENTS
        try:
            with open(path, "rb") as handle:
                return json.loads(handle.readline())
        except (OSError, ValueError):
            raise TrailCorrupt(f"{path} is missing or its first line is malformed") from None

    def list_run_ids(self) -> list[str]:
        if not self.runs_dir.is_dir():
            return []
        return sorted(p.name for p in self.runs_dir.iterdir() if p.is_dir() and not p.name.startswith("."))


__all__ = ["ARTIFACTS", "RunStore", "atomic_write", "new_run_id", "parse_trail"]
