"""The run directory: the only code that opens events.jsonl, run.json and artifacts/.

Layout: ``<state>/runs/<run_id>/{events.jsonl, run.json, artifacts/, .lock}``.
Writers hold the run's file lock (``RunStore.open_run``), which verifies the log first
(``trail.verify`` on ``trail.inspector``'s report); readers never take it and never verify. Each write signs the new
head outside the state dir (``orchestrator.trail.anchor``), then appends and fsyncs its lines
before the engine acts on them; run.json is rewritten atomically (temp file, fsync, rename)
when a writer flushes or closes. A reader that finds run.json behind the log replays the
log, so a crash between the two loses nothing.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import re
import secrets
import signal
import tempfile
import threading
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from typing import Any, Iterator

from orchestrator.errors import RunBusy, RunNotFound, TrailCorrupt, UsageError
from orchestrator.trail.anchor import AnchorWriter, Head
from orchestrator.trail.chain import GENESIS_HASH, SCHEMA_VERSION, chain_hash
from orchestrator.trail.snapshot import apply_event, empty_state, replay
from orchestrator.trail.trail_io import ARTIFACTS, EVENTS, SNAPSHOT, atomic_write, last_line, parse_trail


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def new_run_id(workflow: str) -> str:
    return f"{workflow}-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


def check_artifact_name(name: str) -> str:
    """Artifact names are relative POSIX paths inside artifacts/ (no '..', not absolute)."""
    pure = PurePosixPath(name)
    if not name or pure.is_absolute() or ".." in pure.parts or name.startswith("~"):
        raise UsageError(f"artifact name {name!r} must be a relative path inside artifacts/")
    return str(pure)


class OpenRun:
    """A run opened for writing. Only ``RunStore.open_run`` makes one (lock held).

    Every write is one group commit: the anchor (``orchestrator.trail.anchor``) first, then the
    lines in one ``write`` and one fsync. SIGINT/SIGTERM are held off while a write is in
    progress, so the in-memory state and the log never part.
    """

    def __init__(self, run_dir: Path, state: dict[str, Any], *, genesis: str | None = None,
                 signer: dict[str, Any] | None = None) -> None:
        self.dir = run_dir
        self.run_id = run_dir.name
        self.state = state
        self._genesis, self._signer = genesis, signer
        self._durable = Head(seq=state["last_seq"], hash=state["chain_head"]) if state["last_seq"] >= 0 else None
        self._batch: tuple[list[dict[str, Any]], list[bytes]] | None = None
        self._anchor: AnchorWriter | None = None
        self._fd = os.open(run_dir / EVENTS, os.O_WRONLY | os.O_APPEND)

    def append(self, data: Any, *, actor: str = "engine", phase: str | None = None) -> dict[str, Any]:
        """Append one event (``data`` is an events.* model), fsync it, fold it into the state."""
        return self.append_many([data], actor=actor, phase=phase)[0]

    def append_many(self, items: list[Any], *, actor: str = "engine", phase: str | None = None) -> list[dict[str, Any]]:
        """Append several events with one fsync (group commit): all are durable on return."""
        with signals_held():
            events, lines = self._stage(items, actor=actor, phase=phase)
            if self._batch is not None:
                self._batch[0].extend(events)
                self._batch[1].extend(lines)
            else:
                self._commit(events, lines)
            for event in events:
                apply_event(self.state, event)
        return events

    @contextlib.contextmanager
    def atomic(self) -> Iterator[None]:
        """Events appended inside land in one write, or none does (the state is rolled back)."""
        if self._batch is not None:
            yield
            return
        saved = copy.deepcopy(self.state)
        self._batch = ([], [])
        try:
            yield
            events, lines = self._batch
            if events:
                with signals_held():
                    self._commit(events, lines)
        except BaseException:
            self.state.clear()
            self.state.update(saved)
            raise
        finally:
            self._batch = None

    def _stage(self, items: list[Any], *, actor: str, phase: str | None) -> tuple[list[dict[str, Any]], list[bytes]]:
        seq, prev = self.state["last_seq"], self.state["chain_head"]
        if self._batch is not None and self._batch[0]:
            seq, prev = self._batch[0][-1]["seq"], self._batch[0][-1]["hash"]
        events, lines = [], []
        for data in items:
            seq += 1
            event = {
                "schema_version": SCHEMA_VERSION, "seq": seq, "ts": utc_now(), "run_id": self.run_id,
                "type": data.type, "actor": actor, "phase": phase, "data": data.model_dump(mode="json"),
                "prev_hash": prev,
            }
            event["hash"] = prev = chain_hash(prev, event)
            try:
                lines.append(json.dumps(event, sort_keys=True, separators=(",", ":"),
                                        ensure_ascii=False, allow_nan=False).encode("utf-8") + b"\n")
            except (ValueError, UnicodeEncodeError) as exc:
                raise UsageError(f"event {data.type} cannot be recorded: {exc}") from None
            events.append(event)
        return events, lines

    def _commit(self, events: list[dict[str, Any]], lines: list[bytes]) -> None:
        head = Head(seq=events[-1]["seq"], hash=events[-1]["hash"])
        genesis = self._genesis or events[0]["hash"]
        if self._anchor is None:
            self._anchor = AnchorWriter(self.run_id, genesis, self._signer)
        self._anchor.write(head, self._durable)
        blob = memoryview(b"".join(lines))
        while blob:
            blob = blob[os.write(self._fd, blob):]
        os.fsync(self._fd)
        self._genesis, self._durable = genesis, head

    def read_events(self) -> list[dict[str, Any]]:
        """Every event of this run so far, those staged in an open ``atomic()`` batch included."""
        return parse_trail(self.dir / EVENTS) + (list(self._batch[0]) if self._batch else [])

    def write_artifact_file(self, name: str, content: str | bytes) -> tuple[str, str, int]:
        """Write artifacts/<name> atomically; returns (name, sha256, size). Records nothing."""
        name = check_artifact_name(name)
        blob = content.encode("utf-8") if isinstance(content, str) else content
        path = self.dir / ARTIFACTS / name
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, blob)
        return name, hashlib.sha256(blob).hexdigest(), len(blob)

    def artifact_path(self, name: str) -> Path:
        return self.dir / ARTIFACTS / check_artifact_name(name)

    def flush(self) -> None:
        """Rewrite run.json from the in-memory state (atomic)."""
        atomic_write(self.dir / SNAPSHOT, json.dumps(self.state, indent=1, sort_keys=True).encode())

    def close(self) -> None:
        try:
            self.flush()
        finally:
            os.close(self._fd)
            if self._anchor is not None:
                self._anchor.close()


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Delay SIGINT/SIGTERM (their Python handlers run after the block, never inside it)."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


_HELD_SIGNALS = {signal.SIGINT, signal.SIGTERM}
RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")


def _open_verified(run_dir: Path, verified: Any) -> OpenRun:
    run = OpenRun(run_dir, verified.state, genesis=verified.genesis, signer=verified.signer)
    if verified.repair is not None:
        run.append(verified.repair)
        run.flush()
    return run


class RunStore:
    """All runs under one state directory."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = Path(state_dir).absolute()
        self.runs_dir = self.state_dir / "runs"
        self._local = threading.local()

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

    def create_run(self, run_id: str, started: Any) -> None:
        """Create the run directory with its first event, all or nothing (rename at the end)."""
        self.ensure_writable()
        tmp = Path(tempfile.mkdtemp(dir=self.runs_dir, prefix=f".new-{run_id}-"))
        try:
            (tmp / ARTIFACTS).mkdir()
            (tmp / EVENTS).touch()
            from orchestrator.trail.signing import own_signer

            signer = own_signer(create=True)
            run = OpenRun(tmp, empty_state(run_id), signer=signer)
            run.run_id = run_id
            run.append(started.model_copy(update={"signer": signer}))
            run.close()
            os.replace(tmp, self.runs_dir / run_id)
        except BaseException:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
            raise

    @contextlib.contextmanager
    def open_run(self, run_id: str, *, wait_s: float = 0.0) -> Iterator[OpenRun]:
        """Lock the run (RunBusy after ``wait_s``), verify its trail, yield it, flush on exit.

        Re-entrant within a thread: an agent tool call holds the run while the engine code it
        calls opens it again, so the call and its record land under one lock.
        """
        import filelock

        from orchestrator.trail.verify import verify_for_writing

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
            run = _open_verified(run_dir, verify_for_writing(run_dir))
            held[run_id] = run
            try:
                yield run
            finally:
                held.pop(run_id, None)
                run.close()
        finally:
            lock.release()

    def _held(self) -> dict[str, OpenRun]:
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
        if current:
            return state
        try:
            return replay(parse_trail(run_dir / EVENTS), run_id=run_id)
        except (KeyError, TypeError, AttributeError):
            raise TrailCorrupt(f"{run_dir / EVENTS} does not replay; run `orchestrator audit {run_id}`") from None

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


__all__ = ["GENESIS_HASH", "OpenRun", "RunStore", "atomic_write", "new_run_id", "parse_trail", "utc_now"]
