"""The run directory: the only code that opens events.jsonl, run.json and artifacts/.

Layout: ``<state>/runs/<run_id>/{events.jsonl, run.json, artifacts/, .lock}``.
Writers hold the run's file lock (``RunStore.open_run``); readers never take it.
Each event is written and fsynced before the engine acts on it; run.json is rewritten
atomically (temp file, fsync, rename) when a writer flushes or closes. A reader that
finds run.json behind the log replays the log, so a crash between the two loses nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import tempfile
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from typing import Any, Iterator

from orchestrator.chain import GENESIS_HASH, SCHEMA_VERSION, chain_hash
from orchestrator.errors import RunBusy, RunNotFound, TrailCorrupt, UsageError
from orchestrator.snapshot import apply_event, empty_state, replay

EVENTS = "events.jsonl"
SNAPSHOT = "run.json"
ARTIFACTS = "artifacts"


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def new_run_id(workflow: str) -> str:
    return f"{workflow}-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


def atomic_write(path: Path, content: bytes) -> None:
    """Write ``content`` to ``path`` so that readers see the old or the new file, never half."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(content)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def check_artifact_name(name: str) -> str:
    """Artifact names are relative POSIX paths inside artifacts/ (no '..', not absolute)."""
    pure = PurePosixPath(name)
    if not name or pure.is_absolute() or ".." in pure.parts or name.startswith("~"):
        raise UsageError(f"artifact name {name!r} must be a relative path inside artifacts/")
    return str(pure)


def parse_trail(path: Path) -> list[dict[str, Any]]:
    """Parse events.jsonl; raise TrailCorrupt naming the line that is truncated or malformed."""
    if not path.is_file():
        raise TrailCorrupt(f"{path} is missing: the run's trail is gone; run `orchestrator audit` "
                           "or restore the file from a backup")
    raw = path.read_bytes()
    if raw and not raw.endswith(b"\n"):
        line_no = raw.count(b"\n") + 1
        raise TrailCorrupt(f"{path} is truncated at line {line_no} (no final newline): "
                           "the last write did not finish; run `orchestrator audit` for details")
    events = []
    for line_no, line in enumerate(raw.splitlines(), start=1):
        try:
            events.append(json.loads(line))
        except ValueError as exc:
            raise TrailCorrupt(f"{path} line {line_no} is not JSON ({exc}); "
                               "run `orchestrator audit` for details") from None
    if not events:
        raise TrailCorrupt(f"{path} is empty: a run starts with a run_started event")
    return events


class OpenRun:
    """A run opened for writing. Only ``RunStore.open_run`` makes one (lock held)."""

    def __init__(self, run_dir: Path, state: dict[str, Any]) -> None:
        self.dir = run_dir
        self.run_id = run_dir.name
        self.state = state
        self._log = open(run_dir / EVENTS, "ab")  # noqa: SIM115 (closed in close())

    def append(self, data: Any, *, actor: str = "engine", phase: str | None = None) -> dict[str, Any]:
        """Append one event (``data`` is an events.* model), fsync it, fold it into the state."""
        return self.append_many([data], actor=actor, phase=phase)[0]

    def append_many(self, items: list[Any], *, actor: str = "engine", phase: str | None = None) -> list[dict[str, Any]]:
        """Append several events with one fsync (group commit): all are durable on return."""
        written = [self._write(data, actor=actor, phase=phase) for data in items]
        self._log.flush()
        os.fsync(self._log.fileno())
        return written

    def _write(self, data: Any, *, actor: str, phase: str | None) -> dict[str, Any]:
        event = {
            "schema_version": SCHEMA_VERSION,
            "seq": self.state["last_seq"] + 1,
            "ts": utc_now(),
            "run_id": self.run_id,
            "type": data.type,
            "actor": actor,
            "phase": phase,
            "data": data.model_dump(mode="json"),
            "prev_hash": self.state["chain_head"],
        }
        event["hash"] = chain_hash(event["prev_hash"], event)
        self._log.write(json.dumps(event, sort_keys=True, separators=(",", ":"),
                                   ensure_ascii=False, allow_nan=False).encode("utf-8") + b"\n")
        apply_event(self.state, event)
        return event

    def read_events(self) -> list[dict[str, Any]]:
        """Every event of this run so far (each append is flushed, so the file is complete)."""
        return parse_trail(self.dir / EVENTS)

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
        self.flush()
        self._log.close()


class RunStore:
    """All runs under one state directory."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = Path(state_dir).absolute()
        self.runs_dir = self.state_dir / "runs"

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
        if not run_id or "/" in run_id or run_id.startswith("."):
            raise RunNotFound(f"no run {run_id!r} in {self.runs_dir}")
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
            run = OpenRun(tmp, empty_state(run_id))
            run.run_id = run_id
            run.append(started)
            run.close()
            os.replace(tmp, self.runs_dir / run_id)
        except BaseException:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
            raise

    @contextlib.contextmanager
    def open_run(self, run_id: str) -> Iterator[OpenRun]:
        """Lock the run (or raise RunBusy at once), load its state, flush on exit."""
        import filelock

        run_dir = self.run_dir(run_id)
        lock = filelock.FileLock(run_dir / ".lock", timeout=0)
        try:
            lock.acquire()
        except filelock.Timeout:
            raise RunBusy(f"run {run_id} is busy: another orchestrator process is changing it; "
                          "wait for it to finish (reads such as status never block)") from None
        try:
            run = OpenRun(run_dir, self._load_state(run_dir))
            try:
                yield run
            finally:
                run.close()
        finally:
            lock.release()

    def _load_state(self, run_dir: Path) -> dict[str, Any]:
        events = parse_trail(run_dir / EVENTS)
        head = events[-1]
        try:
            state = json.loads((run_dir / SNAPSHOT).read_text())
        except (OSError, ValueError):
            state = None
        if state and state.get("last_seq") == head["seq"] and state.get("chain_head") == head["hash"]:
            return state
        return replay(events, run_id=run_dir.name)

    def read_state(self, run_id: str) -> dict[str, Any]:
        """The run's snapshot without locking: run.json when current, else a replay of the log."""
        run_dir = self.run_dir(run_id)
        try:
            state = json.loads((run_dir / SNAPSHOT).read_text())
        except (OSError, ValueError):
            return replay(parse_trail(run_dir / EVENTS), run_id=run_id)
        if self._log_head_seq(run_dir) != state.get("last_seq"):
            return replay(parse_trail(run_dir / EVENTS), run_id=run_id)
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

    @staticmethod
    def _log_head_seq(run_dir: Path) -> int | None:
        """Seq of the last complete line, reading only the file's tail."""
        path = run_dir / EVENTS
        try:
            with open(path, "rb") as handle:
                handle.seek(0, os.SEEK_END)
                size = handle.tell()
                handle.seek(max(0, size - 65536))
                tail = handle.read()
        except OSError:
            raise TrailCorrupt(f"{path} is missing: the run's trail is gone") from None
        if not tail.endswith(b"\n"):
            raise TrailCorrupt(f"{path} is truncated (no final newline); run `orchestrator audit`")
        try:
            return int(json.loads(tail.splitlines()[-1])["seq"])
        except (ValueError, KeyError, IndexError):
            raise TrailCorrupt(f"{path} has a malformed last line; run `orchestrator audit`") from None


__all__ = ["GENESIS_HASH", "OpenRun", "RunStore", "atomic_write", "new_run_id", "parse_trail", "utc_now"]
