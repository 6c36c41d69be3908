"""A run opened for writing: the only code that appends to events.jsonl and rewrites run.json.

``RunStore.open_run`` makes an ``OpenRun`` under the run's file lock, after ``trail.verify`` has
checked the log. Every write is one group commit that costs one sync (``OpenRun._commit``):

1. the head for where the log will stand is signed once; the signature goes on the write's first
   line (``signed_head``, ``trail.signed_log``; the first, not the last, so that a write cut
   short still shows its announcement) and into the anchor record (``trail.anchor``), which is
   ``pwrite``-n in place and not synced (the writer syncs it once, on close);
2. the lines, in one ``write`` and one ``fsync`` of the log.

What a crash leaves. kill -9 keeps the page cache, so every finished syscall counts as written:
the anchor names the log's last head, or one write further (killed between 1 and 2, or inside the
``write``); the inspector's ``decide`` marks that repairable, the next writer cuts off whatever
part of it landed and records ``trail_repaired`` (when none of its lines landed there is nothing
to cut, and the next write's head takes the place of the one announced). The anchor never lags
after a kill. A power loss promises only what was fsynced: the log up to its last completed
write. The anchor's page may have gone out or not, so it is level, one write ahead (the same
repair), or behind: at an earlier signed head of the log, or at a write after one that never
landed (a kill) and that the log replaced. The log verifies from its own
signatures, so a lagging anchor is no finding (``audit`` notes it; the next write brings it
level), and a write whose first line landed but not all the rest is announced in the log itself
and repaired alike. Lines after the last signed head that no signed head announces are what
someone without the key appends, and are refused.

What the one sync gives up: the anchor catches a log cut back behind its own head, so after a
power loss the writes since its last write-back (at most those of the command that was running,
since close syncs it) rest on the log's signatures alone, and cutting them off again is caught only
by a witness. A power loss can also leave what is refused although no one tampered: a torn first
line while the anchor's page did not go out, or a torn anchor record. The other order (the lines,
then the anchor) would leave the same torn line after a mere kill -9. The order runs made before
in-log heads keep (the anchor first, with an ``fdatasync`` of its own, then the lines) costs two
syncs a write; those runs still write that way, since their anchor alone vouches for their heads.
run.json is rewritten atomically (temp file, fsync, rename) when a writer flushes or closes; a
reader that finds it behind the log replays the log.
"""

from __future__ import annotations

import contextlib
import os
import _signal
import signal
import time
from pathlib import Path, PurePosixPath
from typing import Any, Iterator

from orchestrator.errors import UsageError
from orchestrator.trail import signed_log
from orchestrator.trail.anchor import AnchorWriter, Head
from orchestrator.trail.chain import SCHEMA_VERSION, SIGNED_HEAD, event_line, with_signed_head
from orchestrator.trail.snapshot import apply_event
from orchestrator.trail.trail_io import ARTIFACTS, EVENTS, SNAPSHOT, atomic_write, parse_trail, resolved_path


def utc_now() -> str:
    """Now in UTC as ``datetime.now(timezone.utc).isoformat(timespec="microseconds")`` writes it.

    Every event is stamped, so the date and time of day are formatted once a second and kept
    (one tuple, swapped whole, so threads never pair one second's text with another's).
    """
    global _SECOND
    second, micro = divmod(time.time_ns() // 1000, 1_000_000)
    cached = _SECOND
    if cached[0] != second:
        cached = _SECOND = (second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)))
    return f"{cached[1]}.{micro:06d}+00:00"


_SECOND: tuple[int, str] = (-1, "")


def check_artifact_name(name: str) -> str:
    """Artifact names are relative POSIX paths inside artifacts/ (no '..', not absolute)."""
    pure = PurePosixPath(name)
    if not name or pure.is_absolute() or ".." in pure.parts or name.startswith("~"):
        raise UsageError(f"artifact name {name!r} must be a relative path inside artifacts/")
    return str(pure)


class OpenRun:
    """A run opened for writing. Only ``RunStore.open_run`` (and ``create_run``) make one (lock held).

    Every write is one group commit: its signed head (on its first line and in the anchor), then
    the lines in one ``write`` and one ``fsync`` (module docstring). SIGINT/SIGTERM are held off
    while a write is in progress, so the in-memory state and the log never part. ``in_log``:
    the run's heads are in the log (runs made before write the anchor first, synced).
    """

    def __init__(self, run_dir: Path, state: dict[str, Any], *, genesis: str | None = None,
                 signer: dict[str, Any] | None = None, in_log: bool = False,
                 who: dict[str, dict[str, Any]] | None = None) -> None:
        self.dir = run_dir
        self.run_id = run_dir.name
        self.state = state
        self._genesis, self._signer, self._in_log = genesis, signer, in_log
        self._who = dict(who or {})
        self._recorded_target: str | None = None
        self._resolve_target()
        self._durable = Head(seq=state["last_seq"], hash=state["chain_head"]) if state["last_seq"] >= 0 else None
        self._batch: tuple[list[dict[str, Any]], list[bytes]] | None = None
        self._anchor: AnchorWriter | None = None
        self._fd = os.open(run_dir / EVENTS, os.O_WRONLY | os.O_APPEND)

    def append(self, data: Any, *, actor: str = "engine", phase: str | None = None) -> dict[str, Any]:
        """Append one event (``data`` is an events.* model), make it durable, fold it into the state."""
        return self.append_many([data], actor=actor, phase=phase)[0]

    def append_many(self, items: list[Any], *, actor: str = "engine", phase: str | None = None) -> list[dict[str, Any]]:
        """Append several events as one write (group commit): all are durable on return."""
        with signals_held():
            events, lines = self._stage(items, actor=actor, phase=phase)
            if self._batch is not None:
                self._batch[0].extend(events)
                self._batch[1].extend(lines)
            else:
                self._commit(events, lines)
            for event in events:
                apply_event(self.state, event)
                if event["type"] == "run_started":
                    self._resolve_target()
        return events

    def _resolve_target(self) -> None:
        """A target recorded relative to the state dir is used as an absolute path (``runs/<id>``'s grandparent);
        run.json keeps it as recorded, so it stays the fold of the log wherever the state dir is."""
        recorded = self.state.get("target")
        if isinstance(recorded, str) and recorded and not os.path.isabs(recorded):
            self._recorded_target = recorded
            self.state["target"] = resolved_path(recorded, self.dir.parent.parent)

    @contextlib.contextmanager
    def atomic(self) -> Iterator[None]:
        """Events appended inside land in one write, or none does (the state is rolled back)."""
        import copy

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
        who = self.who(actor)
        for data in items:
            seq += 1
            event = {
                "schema_version": SCHEMA_VERSION, "seq": seq, "ts": utc_now(), "run_id": self.run_id,
                "type": data.type, "actor": actor, "phase": phase, "data": data.model_dump(mode="json"),
                "prev_hash": prev,
            }
            if who is not None:
                event["who"] = who
            try:
                prev, line = event_line(prev, event)
            except (ValueError, UnicodeEncodeError) as exc:
                raise UsageError(f"event {data.type} cannot be recorded: {exc}") from None
            event["hash"] = prev
            lines.append(line)
            events.append(event)
        return events, lines

    def who(self, actor: str) -> dict[str, Any] | None:
        """The ``who`` record of an event by ``actor``: the one the opener set, else this process's (``identity``);
        None for the engine's own events."""
        if actor == "engine":
            return None
        if actor not in self._who:
            from orchestrator.trail.identity import default_for

            self._who[actor] = default_for(actor)
        return self._who[actor]

    def _commit(self, events: list[dict[str, Any]], lines: list[bytes]) -> None:
        """The signed head, then the log (the order the module docstring explains)."""
        first, last = events[0], events[-1]
        head, durable = Head(seq=last["seq"], hash=last["hash"]), self._durable
        genesis = self._genesis or first["hash"]
        anchor = self._anchor
        if anchor is None:
            anchor = self._anchor = AnchorWriter(self.run_id, genesis, self._signer)
        if self._in_log:
            sig = anchor.sign(head, durable)
            start = first["seq"]
            first[SIGNED_HEAD] = signed_log.member_dict(head, sig, start=start)
            lines[0] = with_signed_head(lines[0], signed_log.member(head, sig, start=start))
            anchor.write(head, durable, sig=sig, sync=False)
        else:
            anchor.write(head, durable)
        blob = lines[0] if len(lines) == 1 else b"".join(lines)
        written = os.write(self._fd, blob)
        if written < len(blob):  # a short write (a signal, a full disk): the rest, or the error it meets
            rest = memoryview(blob)[written:]
            while rest:
                rest = rest[os.write(self._fd, rest):]
        os.fsync(self._fd)
        self._genesis, self._durable = genesis, head

    def read_events(self) -> list[dict[str, Any]]:
        """Every event of this run so far, those staged in an open ``atomic()`` batch included."""
        return parse_trail(self.dir / EVENTS) + (list(self._batch[0]) if self._batch else [])

    def write_artifact_file(self, name: str, content: str | bytes) -> tuple[str, str, int]:
        """Write artifacts/<name> atomically; returns (name, sha256, size). Records nothing."""
        import hashlib

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
        import json

        state = self.state if self._recorded_target is None else {**self.state, "target": self._recorded_target}
        atomic_write(self.dir / SNAPSHOT, json.dumps(state, indent=1, sort_keys=True).encode())

    def close(self) -> None:
        try:
            self.flush()
        finally:
            os.close(self._fd)
            if self._anchor is not None:
                self._anchor.close()


class signals_held:  # noqa: N801 (used as ``with signals_held():``, like the context manager it was)
    """Delay SIGINT/SIGTERM (their Python handlers run after the block, never inside it).

    A class rather than ``contextlib.contextmanager``: it runs around every write, and a generator's
    setup costs more than the two ``pthread_sigmask`` calls it wraps. It calls ``_signal``'s
    ``pthread_sigmask`` (what ``signal.pthread_sigmask`` calls), not the wrapper, which turns every
    mask it returns into a set of ``Signals`` enums: twice the cost of the syscall, at every write.
    """

    __slots__ = ("_old",)

    def __enter__(self) -> None:
        self._old = _sigmask(signal.SIG_BLOCK, _HELD_SIGNALS)

    def __exit__(self, *exc: object) -> None:
        _sigmask(signal.SIG_SETMASK, self._old)


_HELD_SIGNALS = (int(signal.SIGINT), int(signal.SIGTERM))
_sigmask = _signal.pthread_sigmask


def open_verified(run_dir: Path, verified: Any, *, who: dict[str, dict[str, Any]] | None = None) -> OpenRun:
    """The writer for a run ``trail.verify`` has checked; an unfinished write it found is repaired and recorded.

    ``who``: actor -> the ``who`` record of its events (``identity``), for the actors the opener knows.
    """
    run = OpenRun(run_dir, verified.state, genesis=verified.genesis, signer=verified.signer, in_log=verified.in_log,
                  who=who)
    if verified.repair is not None:
        run.append(verified.repair)
        run.flush()
    return run
