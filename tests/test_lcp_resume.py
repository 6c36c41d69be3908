"""A phase cut at a device call's limit reruns without redoing the worker calls it had finished.

The H200 call of 2026-12-04 was cut in correctness after both captures (97 + 101 s); the rerun made both
again. The reference capture (the stack's eager, seeded) now leaves its answer beside its file, and a
rerun on the same machine reads it back; pack_state leaves the file out, so a fresh machine captures anew.
Other workers (traps, graph count, build check, screen) keep their answers in the scratch dir
(``resume.call_kept``), read back only by the rerun of an interrupted attempt on the same machine.
"""

from __future__ import annotations

from phases.kit.bandwidth import BandwidthRequest
from phases.kit.confirm import machine_id
from phases.kit.workers import BANDWIDTH
from phases.local_compile_perf.correctness import captured_reference
from phases.local_compile_perf.resume import call_kept
from phases.local_compile_perf.work.candidate_checks import SaveCaptureRequest

ANSWER = {"file": "", "tensors": {"bf16": 3}, "downcasts": [], "routers": ["layers.1.ffn.router"]}


class StubContext:
    def __init__(self, scratch=None, *, answer: dict | None = None) -> None:
        self.calls, self.notes, self.answer = [], [], answer or ANSWER
        self.scratch_dir, self.phase, self.interrupted = scratch, "ideal_times", False

    def call(self, worker, req, *, label: str = ""):  # noqa: ANN001, ANN201 - PhaseContext.call's
        self.calls.append(label)
        return worker.answer.model_validate(self.answer)

    def note(self, text: str, *, kind: str = "devlog") -> None:
        self.notes.append(text)


def test_the_reference_is_captured_once_then_read_back_until_its_file_or_request_changes(tmp_path) -> None:
    out = tmp_path / "1-x-reference.pt"
    req = SaveCaptureRequest(harness="h:f", device="cuda", tokens=2048, tree="eager", dtypes=("bf16",), out=str(out))
    ctx = StubContext()
    assert captured_reference(ctx, req, checkout="/stack") == ANSWER and ctx.calls == ["capture stack"]
    out.write_bytes(b"the capture")  # what the worker saved
    assert captured_reference(ctx, req, checkout="/stack") == ANSWER and ctx.calls == ["capture stack"]
    assert "read back (1-x-reference.pt), not made again" in ctx.notes[0]
    captured_reference(ctx, req.model_copy(update={"tokens": 1024}), checkout="/stack")
    out.unlink()
    captured_reference(ctx, req, checkout="/stack")
    assert ctx.calls == ["capture stack"] * 3, "another request, or no file (a fresh machine): captured again"


def test_a_kept_answer_is_read_back_only_by_the_rerun_of_a_cut_attempt_on_the_same_machine(tmp_path,
                                                                                           monkeypatch) -> None:
    bw = {"tbs": 3.0, "kind": "hbm", "label": "HBM copy", "nbytes": 1, "copies": 1, "seconds": 1.0, "warmup": 1}
    ctx = StubContext(tmp_path, answer=bw)
    req = BandwidthRequest(device="cuda")
    assert call_kept(ctx, BANDWIDTH, req, label="bandwidth").tbs == 3.0 and ctx.calls == ["bandwidth"]
    call_kept(ctx, BANDWIDTH, req, label="bandwidth")
    assert ctx.calls == ["bandwidth"] * 2, "a phase that was not cut calls again"
    ctx.interrupted = True
    assert call_kept(ctx, BANDWIDTH, req, label="bandwidth").tbs == 3.0 and len(ctx.calls) == 2
    assert ctx.notes == [f"bandwidth: the answer of the attempt that was cut is read back (same request, this "
                         f"machine: {machine_id()}), not computed again"]
    call_kept(ctx, BANDWIDTH, BandwidthRequest(device="cuda:1"), label="bandwidth")
    monkeypatch.setattr("phases.kit.confirm.machine_id", lambda: "boot other, gpu none")
    call_kept(ctx, BANDWIDTH, BandwidthRequest(device="cuda:1"), label="bandwidth")
    assert len(ctx.calls) == 4, "another request, then another machine: called again"
