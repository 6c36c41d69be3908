"""Audit rules of local-compile-perf: what an auditor re-checks from the trail alone.

Each rule takes (events, snapshot) and returns (seq, message) for every violation:

    cited_medians        every cited number has >= 3 fresh-process samples and equals their median
    both_launch_modes    on a CUDA device every cited wall row has its CUDA-graph replay row
    traps_before_baselines  the trap-check worker succeeded before the first baseline number
    devlog_in_order      devlog entries (notes) are timestamped in order, and the first one has the stop rule
    stack_linear         stack entry n's parent is entry n-1's commit (the base for the first)
    no_shared_default    no stack entry enables a region in a shared default list
    prs_asked_a_human    the open_prs answer came from a human
"""

from __future__ import annotations

import statistics
from typing import Any

Violations = list[tuple[int, str]]
MIN_RUNS = 3


def _measurements(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == "measurement_recorded"]


def _records(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == "record_added" and e["data"]["kind"] == kind]


def check_cited_medians(events: list[dict[str, Any]], state: dict[str, Any]) -> Violations:
    out = []
    for e in _measurements(events):
        labels, samples = e["data"]["labels"], e["data"]["samples"]
        if not labels.get("cited"):
            continue
        if len(samples) < MIN_RUNS or labels.get("fresh_processes") != len(samples):
            out.append((e["seq"], f"cited {e['data']['name']} has {len(samples)} sample(s); needs {MIN_RUNS} fresh processes"))
        elif abs(statistics.median(samples) - labels.get("value", float("nan"))) > 1e-9 * max(1.0, abs(labels["value"])):
            out.append((e["seq"], f"cited {e['data']['name']} = {labels.get('value')} is not the median of {samples}"))
    return out


def check_both_launch_modes(events: list[dict[str, Any]], state: dict[str, Any]) -> Violations:
    cited = [e for e in _measurements(events) if e["data"]["labels"].get("cited")]
    replay = {(e["data"]["labels"]["purpose"], e["data"]["labels"]["variant"], e["data"]["labels"]["tokens"])
              for e in cited if e["data"]["name"] == "replay_ms"}
    out = []
    for e in cited:
        labels = e["data"]["labels"]
        on_cpu = str(e["data"]["provenance"].get("device_name", "")).startswith("cpu")
        if e["data"]["name"] == "wall_ms" and not on_cpu and (labels["purpose"], labels["variant"], labels["tokens"]) not in replay:
            out.append((e["seq"], f"{labels['variant']} at {labels['tokens']} has no CUDA-graph replay row on a GPU"))
    return out


def check_traps_before_baselines(events: list[dict[str, Any]], state: dict[str, Any]) -> Violations:
    traps_ok = None
    for e in events:
        if e["type"] == "worker_finished" and e["data"]["label"] == "traps" and e["data"]["status"] == "ok":
            traps_ok = e["seq"]
        if e["type"] == "measurement_recorded" and e["data"]["labels"].get("purpose") == "baseline":
            return [] if traps_ok is not None else [(e["seq"], "baseline recorded before the trap checks passed")]
    return []


def check_devlog_in_order(events: list[dict[str, Any]], state: dict[str, Any]) -> Violations:
    entries = [e for e in events if e["type"] == "note_added"]
    out = [(b["seq"], "devlog entry timestamped before the previous one")
           for a, b in zip(entries, entries[1:]) if b["ts"] < a["ts"]]
    if entries and "stop when" not in entries[0]["data"]["text"]:
        out.append((entries[0]["seq"], "the first devlog entry does not state the budget and stop rule"))
    return out


def check_stack_linear(events: list[dict[str, Any]], state: dict[str, Any]) -> Violations:
    out, previous = [], state["base"].get("commit")
    for e in _records(events, "stack_entry"):
        entry = e["data"]["record"]
        if entry["parent"] != previous or not entry.get("linear"):
            out.append((e["seq"], f"{entry['branch']} is not based on the previous stack entry {str(previous)[:10]}"))
        previous = entry["commit"]
    return out


def check_no_shared_default(events: list[dict[str, Any]], state: dict[str, Any]) -> Violations:
    return [(e["seq"], f"{e['data']['record']['branch']} enables regions in a shared default list: "
                       f"{e['data']['record']['shared_default_edits']}")
            for e in _records(events, "stack_entry") if e["data"]["record"].get("shared_default_edits")]


def check_prs_asked_a_human(events: list[dict[str, Any]], state: dict[str, Any]) -> Violations:
    return [(e["seq"], f"open_prs answered by {e['actor']}, not a human")
            for e in events if e["type"] == "answer_accepted" and e["data"]["key"] == "open_prs" and e["actor"] != "human"]


RULES = {
    "cited_medians": check_cited_medians,
    "both_launch_modes": check_both_launch_modes,
    "traps_before_baselines": check_traps_before_baselines,
    "devlog_in_order": check_devlog_in_order,
    "stack_linear": check_stack_linear,
    "no_shared_default": check_no_shared_default,
    "prs_asked_a_human": check_prs_asked_a_human,
}
