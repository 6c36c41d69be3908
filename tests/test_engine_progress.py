"""Progress lines: a phase's planned steps, a worker's loop as a share of its step, the time left, and what an MCP
client receives (progress rising with every notification, the total of the steps known)."""

from __future__ import annotations

from orchestrator.agent.mcp_server import _CallProgress
from orchestrator.progress import PREFIX, Line, Steps, parse_line


def test_a_phase_says_which_of_its_planned_steps_runs_and_the_time_left() -> None:
    now = [100.0]
    steps = Steps(clock=lambda: now[0])
    steps.plan(4)
    steps.start_one()
    assert str(steps.update("gap_analysis", "worker gap +fp32 started")) == (
        "gap_analysis: worker gap +fp32 started | phase step 1 of 4, ETA after the first step")
    now[0] += 30
    steps.finish_one()
    steps.start_one()
    update = steps.update("gap_analysis", "comparing in bfloat16", Line("comparing in bfloat16", step=2, total=4))
    assert (update.done, update.total, update.eta_s) == (1.25, 4, 66.0)  # 30 s / 1.25 steps x 2.75 steps left
    assert update.where() == "phase step 2 of 4, ETA 1m06s"


def test_more_calls_than_planned_grow_the_total_and_an_unplanned_phase_says_so() -> None:
    steps = Steps()
    steps.plan(1)
    for _ in range(2):
        steps.start_one()
        steps.finish_one()
    assert steps.total == 2
    unplanned = Steps().update("findings", "worker confirm started")
    assert unplanned.total is None and unplanned.where() == "phase step 1, total not known in advance"


def test_a_worker_line_says_its_loop_step_only_when_it_is_a_number() -> None:
    def where(line: Line | None) -> tuple[str, int | None, int | None] | None:
        return None if line is None else (line.message, line.step, line.total)

    assert where(parse_line(PREFIX + '{"message": "m", "step": 2, "total": 3}')) == ("m", 2, 3)
    assert where(parse_line(PREFIX + '{"message": "m", "step": "2", "total": 3}')) == ("m", None, None)
    assert where(parse_line(PREFIX + '{"message": "m", "step": 1, "total": 0}')) == ("m", None, None)
    assert parse_line("plain output") is None


def test_mcp_progress_rises_with_every_notification_over_the_phases_of_one_call() -> None:
    track = _CallProgress()
    sent = [track.place({"phase": "pick_fix", "done": 0.0, "total": 0}),
            track.place({"phase": "graph_budget", "done": 0.0, "total": 3}),
            track.place({"phase": "graph_budget", "done": 0.0, "total": 3}),
            track.place({"phase": "graph_budget", "done": 1.5, "total": 3}),
            track.place({"phase": "screen_confirm", "done": 0.0, "total": 2})]
    values = [v for v, _ in sent]
    assert values == sorted(values) and len(set(values)) == len(values)
    assert [t for _, t in sent] == [0, 3, 3, 3, 5] and values[3] == 1.5
