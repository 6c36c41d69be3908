"""FINDINGS says where the findings phase's cited medians do not add up, and how loaded the host was for each
section (blind trial of 2026-12-05: glue 1102.9 ms on a 417.0 ms wall with no note; selective-AC walls of 27 ms
beside 417 ms walls at the same 512 tokens, timed after the host's other jobs ended)."""

from __future__ import annotations

from orchestrator.context import render_template
from phases.local_compile_perf.timing_notes import headline_per_step, section_loads
from tests.test_lcp_report_text import summary


def cited(wall: float, kernel: float, glue: float) -> dict:
    return {"wall_ms": wall, "kernel_ms": kernel, "glue_ms": glue}


STACK_CODE = {
    "per_tokens": [{"tokens": 512, "upstream_main": cited(417.014, 1757.8, 1102.922),
                    "per_layer_main": cited(359.1, 350.0, 211.5), "regions_stack": cited(444.9, 430.0, 305.5),
                    "per_layer_stack": None}],
    "rows": [{"host_load": 4.6}, {"host_load": 5.1}, {"host_load": None}],
    "under_ac": {"host_load": 0.9},
    "cold_compile": {"rows": [{"host_load": 1.2}, {"host_load": None}]},
}


def test_a_headline_cell_that_does_not_add_up_says_why_and_each_section_says_its_load():
    (note,) = headline_per_step(STACK_CODE, cuda=False)
    assert note.startswith("upstream_main at 512 tokens: the kernel total is 4.22x the wall")
    loads = section_loads(STACK_CODE)
    assert "up to 5.1 on" in loads["side by side"] and "up to 0.9 on" in loads["under AC"]
    assert "up to 1.2 on" in loads["cold compile"]
    assert headline_per_step(None, cuda=True) == [] and section_loads(None) == {}


def test_findings_print_the_notes_under_the_headline():
    s, _ = summary()
    s["headline_per_step"] = headline_per_step(STACK_CODE, cuda=False)
    s["section_loads"] = section_loads(STACK_CODE)
    text = render_template("local_compile_perf", "findings.md.j2", s=s)
    assert "does not add up per step (cited medians): upstream_main at 512 tokens: the kernel total is 4.22x" in text
    assert "host load while timing: 1-minute load average up to 5.1 on" in text


def test_an_op_whose_samples_were_disturbed_is_named_noisy():
    """Blind trial of 2026-12-05: swiglu's forward 44.09 ms beside its forward+backward 0.66 ms, rms_norm#1 at
    529 ms ranked first; both read as measured."""
    from phases.local_compile_perf.ideal_times import noise_of

    swiglu = {"fwd_ms": [44.0, 45.0, 43.0], "fwdbwd_ms": [0.66, 0.7, 0.6]}
    assert noise_of(swiglu).startswith("its forward (44.0000 ms) took longer than its forward+backward (0.6600 ms)")
    spiky = {"fwd_ms": [1.4, 1.5, 1.4], "fwdbwd_ms": [2.0, 527.9, 530.0]}
    assert noise_of(spiky) == "samples 2.0000..530.0000 ms per call, the slowest 265x the fastest"
    steady = {"fwd_ms": [1.0, 1.1, 0.9], "fwdbwd_ms": [3.0, 3.2, 2.9]}
    assert noise_of(steady) == ""
    fwd_only = {"fwd_ms": [1.0, 1.1, 0.9], "fwdbwd_ms": []}
    assert noise_of(fwd_only) == ""


def test_ops_timed_alone_above_the_steps_glue_are_called_out():
    from phases.local_compile_perf.rank import what_outside

    above = what_outside(-15.4, 513.976, cuda=False)
    assert "add up to 529.376 ms, more than the step's 513.976 ms of eager glue" in above
    assert "samples disturbed on a shared host" in above
    assert "each waits on its own launches" in what_outside(-1.0, 10.0, cuda=True)
