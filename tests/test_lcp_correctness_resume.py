"""A correctness phase cut after its reference capture compares against that capture when it reruns.

The H200 call of 2026-12-04 was cut in correctness after both captures (97 + 101 s); the rerun made both
again. The reference capture (the stack's eager, seeded) now leaves its answer beside its file, and a
rerun on the same machine reads it back; pack_state leaves the file out, so a fresh machine captures anew.
"""

from __future__ import annotations

from phases.local_compile_perf.correctness import captured_reference
from phases.local_compile_perf.work.candidate_checks import SaveCaptureRequest

ANSWER = {"file": "", "tensors": {"bf16": 3}, "downcasts": [], "routers": ["layers.1.ffn.router"]}


class StubContext:
    def __init__(self) -> None:
        self.calls, self.notes = [], []

    def call(self, worker, req, *, label: str = ""):  # noqa: ANN001, ANN201 - PhaseContext.call's
        self.calls.append(label)
        return worker.answer.model_validate(ANSWER)

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
