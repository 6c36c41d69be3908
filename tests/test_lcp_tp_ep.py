"""The correctness phase's TP/EP build check: the embedded layer at world 8 (TP8/EP8) on a fake process group.

The worker runs as the phase runs it (a subprocess), with the regions bound through ``aot_eager``: the
same Dynamo graphs and guards as Inductor, without its code generation: about 10-20 s a check on a 2-core host.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest

from orchestrator.context import render_template
from phases.local_compile_perf.records import ParallelBuildCheck, TpEpVerdict
from phases.local_compile_perf.tp_ep import rule
from phases.local_compile_perf.work.tp_ep_check import ParallelCheckRequest
from tests.conftest import call_worker

EMBEDDED = "phases.local_compile_perf.embedded.moe_layer.harness:build_harness"
WORKER = "phases.local_compile_perf.work.tp_ep_check:tp_ep_worker"


def check(harness: str, regions: tuple[str, ...], progress: list[str] | None = None) -> ParallelBuildCheck:
    request = ParallelCheckRequest(harness=harness, device="cpu", regions=regions, compile_backend="aot_eager")
    on_progress = progress.append if progress is not None else None
    return ParallelBuildCheck.model_validate(call_worker(WORKER, request.model_dump(mode="json"),
                                                         on_progress=on_progress))


@pytest.fixture(scope="module")
def embedded_run() -> tuple[ParallelBuildCheck, list[str]]:
    progress: list[str] = []
    return check(EMBEDDED, ("router", "swiglu"), progress), progress


@pytest.fixture(scope="module")
def embedded(embedded_run: tuple[ParallelBuildCheck, list[str]]) -> ParallelBuildCheck:
    return embedded_run[0]


def test_the_check_reports_each_item_as_it_goes(embedded_run: tuple[ParallelBuildCheck, list[str]]) -> None:
    """Blind trial of 2026-12-05: a submit rejected at TP/EP sent 41 s of silence; now one line per item."""
    progress = [m for m in embedded_run[1] if m.startswith("TP/EP build check: ")]
    assert [m.removeprefix("TP/EP build check: ").split(" (step")[0] for m in progress] == [
        "shapes at DSv3's real dims, world 8 (meta)", "shapes of the stepped layer",
        "rank 0 fwd+bwd at 16 tokens", "rank 0 fwd+bwd at 24 tokens", "rank 7 (zero tokens) fwd+bwd at 16 tokens"]
    assert "(step 2 of 2, ETA " in progress[3]


def test_every_parameter_is_its_global_shape_split_by_8(embedded: ParallelBuildCheck) -> None:
    assert embedded.items["shapes_real"] == embedded.items["shapes_build"] == "PASS"
    real = {s.name: s for s in embedded.shapes_real}
    assert real["1.ffn.experts.w13"].global_shape == (256, 4096, 7168)
    assert real["1.ffn.experts.w13"].local_shape == (32, 4096, 7168)
    assert real["0.attention.wq_b.weight"].local_shape == (24576 // 8, 1536)
    assert real["0.attention.wo.weight"].local_shape == (7168, 16384 // 8)
    assert real["1.ffn.router.gate.weight"].local_shape == (256, 7168)
    sharded = [s for s in embedded.shapes_real if s.degree == 8]
    assert len(sharded) == 14 and all(s.ok for s in embedded.shapes_real)


def test_both_ranks_step_and_the_zero_token_rank_gets_no_row(embedded: ParallelBuildCheck) -> None:
    first, last = embedded.ranks
    assert (first.rank, last.rank) == (0, 7) and first.status == last.status == "PASS"
    assert all(first.rows_received) and last.zero_tokens and last.rows_received == (0,) and last.rows_sent[0] > 0
    assert last.empty_expert_calls == 32 and last.stand_ins
    assert embedded.graph_breaks == 0 and embedded.items["graph_budget"] == "PASS"
    assert embedded.graphs == {"router": 2, "swiglu": 2}


def test_the_empty_rank_recompiles_swiglu_and_says_why(embedded: ParallelBuildCheck) -> None:
    """Dynamo specializes a size of 0: the first step without rows costs swiglu one graph (recorded, not hidden)."""
    assert embedded.zero_token_growth == {"router": 0, "swiglu": 1}
    assert embedded.items["zero_token_graphs"] == "FAIL" and embedded.status == "FAIL"
    assert any("swiglu" in r and "actual 0" in r for r in embedded.recompile_reasons)
    blocking, findings = rule(embedded, None)
    assert blocking == () and "within the graph budget" in findings[0]


def test_the_artifact_shows_the_check(embedded: ParallelBuildCheck) -> None:
    verdict = TpEpVerdict(candidate="c1", check=embedded, findings=rule(embedded, None)[1])
    text = render_template("local_compile_perf", "correctness.md.j2", label="narrow", candidate="c1", tokens=16,
                           routers=[], downcasts=[], comparisons=[], tp_ep=verdict.model_dump(mode="json"))
    assert "## TP/EP build check at world 8: FAIL" in text and "not a correctness comparison" in text
    assert "| zero_token_graphs | FAIL | - |" in text and "| 1.ffn.experts.w13 | 256x4096x7168 | 32x4096x7168 |" in text


def full_heads_harness() -> object:
    """The embedded layer with a rewrite whose region views q with the model's full head count (a TP bug)."""
    import torch

    from phases.local_compile_perf.embedded.moe_layer import attention, harness
    from phases.local_compile_perf.embedded.moe_layer.config import DSV3_REAL
    from phases.local_compile_perf.embedded.moe_layer.local_compile import local_compile

    @local_compile("q_heads")
    def split_heads(q: torch.Tensor) -> torch.Tensor:
        return q.view(q.shape[0], DSV3_REAL.n_heads, -1)

    original = attention.MLAttention._project_qkv

    def project_qkv(self, x, freqs_cis):  # noqa: ANN001, ANN202 - the patched method's own signature
        split_heads(self.wq_b(self.q_norm(self.wq_a(x))))
        return original(self, x, freqs_cis)

    attention.MLAttention._project_qkv = project_qkv
    return harness.build_harness()


def test_a_region_that_assumes_the_full_head_count_is_caught() -> None:
    broken = check("tests.test_lcp_tp_ep:full_heads_harness", ("router", "q_heads"))
    assert broken.status == "FAIL" and broken.items["shapes_real"] == "PASS"
    assert broken.items["rank_0"] == broken.items["rank_7"] == "FAIL"
    assert "is invalid for input of size" in broken.failures["rank_0"], broken.failures
    stack = ParallelBuildCheck(status="PASS", world_size=8, tp=8, ep=8, items={"rank_0": "PASS", "rank_7": "PASS"})
    blocking, findings = rule(broken, stack)
    assert blocking == ("rank_0", "rank_7")
    assert "zero_token_graphs: not run (an earlier item failed)" in findings


def test_a_failure_the_stack_has_too_does_not_reject() -> None:
    failed = {"rank_0": "FAIL", "graph_budget": "UNRUN"}
    cand = ParallelBuildCheck(status="FAIL", world_size=8, tp=8, ep=8, items=failed, failures={"rank_0": "boom"})
    stack = ParallelBuildCheck(status="FAIL", world_size=8, tp=8, ep=8, items={"rank_0": "FAIL"})
    assert rule(cand, stack) == ((), ("rank_0: the stack fails it too: boom", "graph_budget: not run (an earlier "
                                                                                "item failed)"))
    unrun = ParallelBuildCheck(status="UNRUN", reason="hf target", world_size=8, tp=8, ep=8)
    assert rule(unrun, None) == ((), ("not run: hf target",))


class StubContext:
    """What check_tp_ep asks of a phase context: a worker per checkout, answered from ``answers``."""

    def __init__(self, answers: dict[str, ParallelBuildCheck]) -> None:
        self.answers, self.asked = answers, []
        self.scratch_dir, self.phase = Path(tempfile.mkdtemp(prefix="lcp-tp-ep-")), "graph_budget"
        self.interrupted = False

    def call(self, worker: Any, request: Any, *, label: str = "") -> Any:
        self.asked.append((request.checkout, tuple(request.request["regions"])))
        return worker.answer.model_validate(self.answers[request.checkout].model_dump(mode="json"))


def candidate() -> object:
    from phases.local_compile_perf.records import Candidate, PreparedCandidate

    prepared = PreparedCandidate(n=1, name="1-x", tip="t", commits=("c",), wip_branch="w", wip_commit="c",
                                 stack_checkout="/stack", candidate_checkout="/cand", files=(), regions_source="",
                                 candidate_regions=("swiglu",), stack_regions=("router",))
    return Candidate(id="c1", branch="b", label="x", actor="agent", submitted_at="now", prepared=prepared)


def test_the_stack_is_checked_only_when_the_candidate_fails_and_then_rules() -> None:
    from phases.local_compile_perf.records import Plan
    from phases.local_compile_perf.tp_ep import check_tp_ep

    plan = Plan.model_construct(kind="embedded", harness=EMBEDDED)
    passing = ParallelBuildCheck(status="PASS", world_size=8, tp=8, ep=8, items={"rank_0": "PASS"})
    ctx = StubContext({"/cand": passing})
    assert check_tp_ep(ctx, plan, candidate()).blocking == () and ctx.asked == [("/cand", ("router", "swiglu"))]
    broken = ParallelBuildCheck(status="FAIL", world_size=8, tp=8, ep=8, items={"rank_0": "FAIL"},
                                failures={"rank_0": "view"})
    ctx = StubContext({"/cand": broken, "/stack": passing})
    verdict = check_tp_ep(ctx, plan, candidate())
    assert verdict.blocking == ("rank_0",) and verdict.stack_items == {"rank_0": "PASS"}
    assert ctx.asked[1] == ("/stack", ("router",))
    growth = ParallelBuildCheck(status="FAIL", world_size=8, tp=8, ep=8, items={"rank_0": "PASS",
                                "zero_token_graphs": "FAIL"}, failures={"zero_token_graphs": "swiglu +1"})
    ctx = StubContext({"/cand": growth})
    verdict = check_tp_ep(ctx, plan, candidate())
    assert verdict.blocking == () and len(ctx.asked) == 1, "a never-blocking item alone needs no stack check"
    assert verdict.findings == ("zero_token_graphs: swiglu +1 (within the graph budget: recorded, not a rejection)",)
    hf = check_tp_ep(StubContext({}), Plan.model_construct(kind="hf", harness="x"), candidate())
    assert hf.check.status == "UNRUN" and "embedded layer" in hf.check.reason and hf.blocking == ()


def test_the_device_stack_builds_at_world_8(tmp_path) -> None:
    """The seven rewrites the H200 runs submitted as one candidate, rejected at world 8 on 2026-12-04
    (bench/results/2026-12-04-h200-lcp): their regions now do the TP of the weights they are handed. With them,
    the router's top-k as argmax rounds (router-topk), as bench/h200_lcp.sh submits them."""
    from bench.tp_ep_stack import DEVICE_STACK, check_stack

    check, blocking = check_stack(DEVICE_STACK, backend="aot_eager", state_dir=tmp_path)
    assert blocking == () and check["items"]["rank_0"] == check["items"]["rank_7"] == "PASS", check["failures"]
    assert check["items"]["graph_budget"] == "PASS" and check["zero_token_growth"]["swiglu"] == 1, check


def test_a_rank_error_names_where_it_was_raised() -> None:
    """The trial of 2026-12-04: 'not enough values to unpack (expected 3, got 2)' came with no file or line."""
    from phases.local_compile_perf.work.tp_ep_check import error_text

    def experts_forward(*inputs):
        x, counts, offsets = inputs
        return x

    try:
        experts_forward(1, 2)
    except ValueError as exc:
        text = error_text(exc)
    assert text.startswith("ValueError: not enough values to unpack (expected 3, got 2)")
    assert f'File "{__file__}", line ' in text and "in experts_forward" in text, text


def unweighted_experts_harness() -> Any:
    """The embedded layer with the routing weights applied at the combine: the experts take (rows, counts)."""
    from phases.local_compile_perf.embedded.moe_layer import experts, harness, moe

    def experts_forward(self, x, counts):  # noqa: ANN001, ANN202 - the patched method's own signature
        h = experts.expert_swiglu(self._matmul(x, self.w13, counts))
        return self._matmul(h, self.w2, counts)

    def moe_forward(self, x):  # noqa: ANN001, ANN202
        weights, chosen = self.router(x)
        rows, counts, row_weights, token_index = moe.dispatch_tokens(x, chosen, weights,
                                                                     n_local=self.config.n_local_experts)
        weighted = (self.experts(rows, counts).float() * row_weights.unsqueeze(-1)).to(rows.dtype)
        return moe.combine_tokens(weighted, token_index, tokens=x.shape[0]) + self.shared(x)

    experts.GroupedExperts.forward = experts_forward
    moe.MoE.forward = moe_forward
    return harness.build_harness()


def test_experts_that_take_rows_and_counts_only_build_at_world_8() -> None:
    """Blind trial of 2026-12-05: a correct rewrite that applied the weights after the experts was rejected with
    'not enough values to unpack (expected 3, got 2)' from the plan's dispatch."""
    two = check("tests.test_lcp_tp_ep:unweighted_experts_harness", ("router", "swiglu"))
    assert two.items["rank_0"] == two.items["rank_7"] == "PASS", two.failures
    from phases.local_compile_perf.work.tp_ep_plan import split_expert_inputs

    with pytest.raises(ValueError, match=r"experts\(rows \[R, D\], counts \[E\], \*per-row \[R\] tensors\)"):
        split_expert_inputs(("rows",))
