"""What the engine does as a command takes a run and as the run enters a phase, before any phase code runs.

A command killed mid-``git`` leaves a lock that every later git write in the target would fail on,
whichever phase it was in or between (``clear_dead_git_locks``); a question a phase asks whatever it
finds is known as soon as the run reaches the phase, so it waits for a person from then on
(``ask_known_questions``).
"""

from __future__ import annotations

from typing import Any

from orchestrator.trail import events as ev
from orchestrator.trail.writer import OpenRun
from orchestrator.workflow import DONE


def ask_known_questions(run: OpenRun, workflow: Any) -> None:
    """Ask the questions the run's current phase asks whatever it finds (``PhaseSpec.asks``) and nobody answered:
    known before the phase runs, they wait for a person now rather than after the next advance."""
    phase = run.state["phase"]
    if phase == DONE:
        return
    answered = set(run.state["answers"]) | {q["key"] for q in run.state["pending"]}
    asked = [ev.QuestionAsked(key=q.key, prompt=q.prompt, choices=list(q.choices) if q.choices else None,
                              answer_schema=q.schema, human_only=q.human_only)
             for q in workflow.phase(phase).asks if q.key not in answered]
    if asked:
        run.append_many(asked, phase=phase)


def clear_dead_git_locks(run: OpenRun) -> None:
    """A command killed mid-``git`` (a guard's ``git status``, a revert's ``checkout``) leaves a lock behind, whatever
    phase it was in or between; every later git write in the target would fail on it. Called under the run's lock
    before anything of the run touches git."""
    from orchestrator.git import clear_dead_git_locks as clear

    removed = clear(run.state["target"])
    if removed:
        run.append(ev.NoteAdded(kind="engine", text="removed the git lock(s) a command that died left (no live "
                                                    "process holds them): " + ", ".join(removed)),
                   phase=run.state["phase"] or None)
