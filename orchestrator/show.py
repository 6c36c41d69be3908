"""``orchestrator show RUN``: a run as a person reads it, and who did what (its acts).

The text: where the run stands (phase, status, summary, target, inputs, the key its log names), who
acted (one line per person or agent, from the events' ``who``), every act in one line (an act is an
event by a person or an agent; an answer says how long after its question it came), the files each
change touched, the pending questions, the issues, the recent events in one line each, and the
artifacts. ``--seq N`` prints events whole (what a report's "seq N" points to). The same facts go
to ``--json``.
Nothing here verifies anything: ``orchestrator audit`` does.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from orchestrator.trail.identity import actors, label, process_label

MAX_TEXT = 160


def acts(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every event by a person or an agent: who, what (one line), and for an answer its question's seq and lag."""
    asked: dict[str, dict[str, Any]] = {}
    found = []
    for event in events:
        data = event.get("data") if isinstance(event.get("data"), dict) else {}
        if event.get("type") == "question_asked":
            asked[str(data.get("key"))] = event
        if event.get("actor") == "engine":
            continue
        act = {"seq": event.get("seq"), "ts": str(event.get("ts", "")), "actor": event.get("actor"),
               "who": event.get("who"), "type": event.get("type"), "what": summary(event), "after_question": None,
               "key": str(data.get("key")) if event.get("type") == "answer_accepted" else None}
        question = asked.get(str(data.get("key"))) if event.get("type") == "answer_accepted" else None
        if question is not None:
            act["after_question"] = {"seq": question["seq"], "seconds": _seconds(question["ts"], event["ts"])}
        found.append(act)
    return found


def changes(events: list[dict[str, Any]]) -> list[tuple[dict[str, Any], list[str]]]:
    """(event, the files it names) for every event that records files it changed: a ``files`` member (temporary
    patches and their reverts, edits), a record's (a commit), or an agent's write_file / edit_file call (its path).
    Where the trail records edits whole (``edit_recorded``), a tool call's path is left to the edit that names it."""
    found = []
    whole = any(event.get("type") == "edit_recorded" for event in events)
    for event in events:
        data = event.get("data") if isinstance(event.get("data"), dict) else {}
        record = data.get("record") if isinstance(data.get("record"), dict) else {}
        files = data.get("files", record.get("files"))
        names = [str(n) for n in files] if isinstance(files, (dict, list)) else []
        arguments = data.get("arguments") if isinstance(data.get("arguments"), dict) else {}
        if not names and not whole and data.get("tool") in _PATH_TOOLS and isinstance(arguments.get("path"), str):
            names = [arguments["path"]]
        if names:
            found.append((event, names))
    return found


def _change_line(event: dict[str, Any], files: list[str]) -> str:
    who = label(event.get("who"), str(event.get("actor"))) if event.get("actor") != "engine" else "engine"
    kind = f" {event['data'].get('kind')}" if event.get("type") == "record_added" else ""
    return f"  seq {event.get('seq')!s:<5} {who}  {event.get('type')}{kind}: {', '.join(files)}"


_PATH_TOOLS = ("write_file", "edit_file")


def seqs_text(seqs: list[int]) -> str:
    shown = ", ".join(str(s) for s in seqs[:12])
    return shown + (f" and {len(seqs) - 12} more" if len(seqs) > 12 else "")


def show_text(state: dict[str, Any], events: list[dict[str, Any]], *, recent: int, state_dir: str) -> str:
    first = events[0] if events else {"data": {}}
    lines = _header(state, first)
    lines += ["", "who acted (as the process that wrote each act said of itself; nothing authenticates it)"]
    lines += [f"  {row['label']:48} {len(row['seqs'])} act(s): seq {seqs_text(row['seqs'])}"
              for row in actors(events)] or ["  nobody but the engine"]
    lines += ["", "acts (every event by a person or an agent)"]
    lines += [act_line(act) for act in acts(events)] or ["  none"]
    lines += ["", "files changed (every event that names the files it changed; --seq N for blob ids and the diff)"]
    lines += [_change_line(event, files) for event, files in changes(events)] or ["  none recorded"]
    lines += ["", "pending questions"] + (_questions(state) or ["  none"])
    lines += ["", "issues"] + ([_issue(i) for i in state.get("issues") or []] or ["  none"])
    shown = events[-recent:] if recent > 0 else []
    lines += ["", f"recent events (last {len(shown)} of {len(events)}; --events N for more, --seq N for one whole)"]
    lines += [event_line(e) for e in shown]
    artifacts = state.get("artifacts") or {}
    lines += ["", f"artifacts ({len(artifacts)}, under {state_dir}/runs/{state['run_id']}/artifacts/)"]
    lines += [f"  {sha[:12]}  {name}" for name, sha in sorted(artifacts.items())]
    return "\n".join(lines)


def _header(state: dict[str, Any], first: dict[str, Any]) -> list[str]:
    started = first.get("data") or {}
    recorded = started.get("target", "")
    inside = f" (recorded as {recorded}, inside the state dir)" if recorded and recorded != state["target"] else ""
    base = state.get("base") or {}
    lines = [f"run       {state['run_id']}   workflow {state['workflow']}",
             f"target    {state['target']}{inside}",
             f"base      commit {str(base.get('commit', '?'))[:12]} on {base.get('branch') or 'a detached HEAD'}"]
    for item in started.get("inputs") or []:
        kept = f", kept as artifacts/{item['artifact']}" if item.get("artifact") else ""
        digest = f"sha256 {item['sha256']}" if item.get("sha256") else "not hashed"
        note = f" ({item['note']})" if item.get("note") else ""
        lines.append(f"input     {', '.join(item['options'])}: {item['path']}  {digest}{kept}{note}")
    waiting = f"   waiting for {state['awaiting']}" if state.get("awaiting") else ""
    lines.append(f"phase     {state['phase']}   status {state['status']}{waiting}")
    if state.get("summary"):
        lines.append(f"summary   {state['summary']}")
    lines.append(f"signer    {_signer(started, state['run_id'])}")
    return lines


def _signer(started: dict[str, Any], run_id: str) -> str:
    signer = started.get("signer")
    if not isinstance(signer, dict):
        return "none named (a legacy run: its heads carry an HMAC under trail.key)"
    from orchestrator.trail.signing import describe

    return (f"{describe(signer)}, public key {signer.get('public_key')}: the key the log names itself "
            f"(`orchestrator audit {run_id} --key FILE` checks it against the one you pin)")


def _questions(state: dict[str, Any]) -> list[str]:
    lines = []
    for question in state.get("pending") or []:
        choices = f" ({' | '.join(question['choices'])})" if question.get("choices") else ""
        who = "a person only" if question.get("human_only") else "a person or the agent"
        lines.append(f"  {question['key']}{choices}, for {who}: {question['prompt']}")
    return lines


def _issue(issue: dict[str, Any]) -> str:
    where = f"  [fix in {issue['fix_location']}]" if issue.get("fix_location") else ""
    return f"  {issue['code']}: {issue['message']}{where}"


def act_line(act: dict[str, Any]) -> str:
    lag = act["after_question"]
    after = f", {lag['seconds']:.2f} s after question seq {lag['seq']}" if lag and lag["seconds"] is not None else ""
    if lag is None and act["type"] == "answer_accepted":
        after = (", a waiver (no question asks for one)" if str(act.get("key")).startswith("waive:")
                 else ", given before any question asked it (a start option or an early answer)")
    how = process_label(act["who"])
    return (f"  seq {act['seq']!s:<5} {act['ts'][:19].replace('T', ' ')}  {label(act['who'], str(act['actor']))}  "
            f"{act['type']} {act['what']}{after}" + (f"  [{how}]" if how else ""))


def event_line(event: dict[str, Any]) -> str:
    return (f"  {event.get('seq')!s:>6} {str(event.get('ts', ''))[:19].replace('T', ' ')} {event.get('actor')!s:6} "
            f"{event.get('phase') or '-':18} {event.get('type')}: {summary(event)}")


def summary(event: dict[str, Any]) -> str:
    """What an event says, in one line (its files first where it names files)."""
    data = event.get("data") if isinstance(event.get("data"), dict) else {}
    text = _SUMMARIES.get(str(event.get("type")), _generic)(data)
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT - 3] + "..."


def _files(data: dict[str, Any]) -> str:
    files = data.get("files")
    names = list(files) if isinstance(files, (dict, list)) else []
    return f"files {', '.join(str(n) for n in names)}" if names else ""


def _generic(data: dict[str, Any]) -> str:
    parts = [_files(data)] + [f"{k}={_short(v)}" for k, v in data.items() if k not in ("type", "files")]
    return "; ".join(p for p in parts if p)


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def _agent_acted(data: dict[str, Any]) -> str:
    arguments = data.get("arguments") or {}
    path = f" {arguments['path']}" if isinstance(arguments.get("path"), str) else ""
    return f"{data.get('tool')}{path}: {data.get('outcome')} (call {data.get('call_id')})"


_SUMMARIES = {
    "run_started": lambda d: f"{d.get('workflow')} on {d.get('target')}",
    "phase_started": lambda d: f"attempt {d.get('attempt')}",
    "phase_interrupted": lambda d: f"attempt {d.get('attempt')} never completed; {d.get('action')}",
    "phase_completed": lambda d: f"{d.get('outcome')}: {d.get('summary')}",
    "transition_taken": lambda d: f"{d.get('source')} -> {d.get('dest')}",
    "gate_blocked": lambda d: f"cannot enter {d.get('dest')}: {'; '.join(d.get('reasons') or [])}",
    "guard_violated": lambda d: f"{d.get('guard')}: {d.get('message')}",
    "question_asked": lambda d: f"{d.get('key')}: {d.get('prompt')}",
    "answer_accepted": lambda d: f"{d.get('key')}={_short(d.get('value'))}",
    "artifact_written": lambda d: f"{d.get('name')} ({d.get('bytes')} bytes, sha256 {str(d.get('sha256'))[:12]})",
    "measurement_recorded": lambda d: f"{d.get('name')}: {len(d.get('samples') or [])} sample(s) in {d.get('unit')}",
    "note_added": lambda d: f"[{d.get('kind')}] {d.get('text')}",
    "worker_finished": lambda d: f"{d.get('label') or d.get('func')}: {d.get('status')} in {d.get('seconds')} s "
                                 f"(log {d.get('log')})",
    "agent_acted": _agent_acted,
    "patch_applied": lambda d: f"{d.get('patch_id')} ({d.get('label')}): {_files(d)}; diff artifacts/{d.get('diff')}",
    "patch_reverted": lambda d: f"{', '.join(d.get('patch_ids') or [])}: {_files(d)}",
    "record_added": lambda d: f"{d.get('kind')}: {_short(d.get('record'))}",
    "run_aborted": lambda d: str(d.get("reason")),
    "run_finished": lambda d: str(d.get("summary")),
}


def _seconds(start: str, end: str) -> float | None:
    try:
        return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()
    except ValueError:
        return None
