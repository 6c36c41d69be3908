"""What the numerics phase and the gap analysis may send to the agent, and what each such finding promises.

The probe's half of the fixability contract is ``fixability.py``; this module is the other half, kept apart so
each can change without the other. Per phase, ``AGENT_BOUND`` lists every code whose finding makes the phase
answer ``needs_agent``. Each code is one of:

- ``PROVEN``: a reference fix inside the experiment folder, written as an agent would, clears it on a real run
  and the run moves on (the test named beside it);
- ``NOT_YET_SHOWN``: its fix belongs in the experiment folder but no test has cleared it yet, and why;
- ``LEDGER_PATCH``: the agent's fix is a temporary hypothesis patch through the patch ledger (core files
  included, applied, measured and reverted by the engine), never an edit of the experiment folder.

Codes whose fix is not the agent's are not here: ``error_triage.NOT_THE_AGENTS`` wait for a person (waive with
a reason, or abort) and name the real place (transformers, torchtitan core, the orchestrator's synthetic entry);
``error_triage.OURS`` fail the phase as an error of ours. tests/test_moe_fixability_contract.py reads the codes
each phase can emit from its source and fails for an agent-bound code declared nowhere here.
"""

from __future__ import annotations

NUMERICS_TEST = ("tests/test_moe_fixability_numerics.py::"
                 "test_qwen3_numerics_findings_clear_one_by_one_under_reference_fixes_and_the_run_moves_on")

# code -> (the experiment-folder file its reference fix changes, the test that shows the finding clear)
PROVEN: dict[str, tuple[str, str]] = {
    # Proven where the innermost frame is the experiment folder (the finding names that file); with no frame
    # there and none in core (our worker's frame, or none recorded) it names the frame it has, unproven.
    "numerics_error": ("moe_replacement.py (innermost frame in the experiment folder; Qwen3-30B-A3B: top-k looked "
                       "up by the real model's expert count)", NUMERICS_TEST),
    "probe_value_error": ("moe_replacement.py (Qwen3-30B-A3B: a guard for the real model's expert count)",
                          NUMERICS_TEST),
    "adapter_shape_mismatch": ("state_dict_adapter.py (Qwen3-30B-A3B: down_proj transposed one way)", NUMERICS_TEST),
    "state_dict_roundtrip_failed": ("state_dict_adapter.py (Qwen3-30B-A3B: down_proj transposed one way)",
                                    NUMERICS_TEST),
    "adapter_keys_dropped": ("state_dict_adapter.py (Qwen3-30B-A3B: the router's Titan key without its gate level)",
                             NUMERICS_TEST),
}

# The skill's error triage codes that go to the agent (error_triage.triage_error): the pretrained comparison
# (``--weights``) emits each one again as ``pretrained_<code>``.
TRIAGE_AGENT_CODES = ("probe_value_error", "adapter_shape_mismatch", "grouped_mm_shape_error", "numerics_error")

NOT_YET_SHOWN: dict[str, str] = {
    "grouped_mm_shape_error": "expert weight shapes (moe_replacement.py's layout detection, state_dict_adapter.py's "
                              "transpose); on torchtitan 0.3.0 the load's size check meets a mis-shaped expert "
                              "weight first (adapter_shape_mismatch), and no experiment-folder bug that reaches the "
                              "grouped matmul with a loadable shape is written yet",
    **{f"pretrained_{code}": f"the synthetic comparison's {code} on the --weights checkpoint: the same triage and the "
                             "same fix place; no contract run starts with a checkpoint" for code in TRIAGE_AGENT_CODES},
}

LEDGER_PATCH: dict[str, str] = {
    "residual_gap_unexplained": "a temporary hypothesis patch (core files included) for the stage where the trace "
                                "finds HF and Titan first diverge, through the patch ledger: `orchestrator patch RUN "
                                "--file PATCH --label TEXT` or the submit tool's kind=patch; the engine measures it, "
                                "traces again and reverts every patch before the table. Never an experiment-folder "
                                "edit, never committed (tests/test_moe_gap_cpu.py, tests/test_moe_gap_recipes.py, "
                                "tests/test_engine_ledger.py)",
}

AGENT_BOUND: dict[str, frozenset[str]] = {
    "numerics": frozenset(PROVEN) | frozenset(NOT_YET_SHOWN),
    "gap_analysis": frozenset(LEDGER_PATCH),
}


def promise(code: str) -> str:
    """What a needs_agent finding of numerics or gap analysis promises, in one bracketed note ('' if none known)."""
    if code in PROVEN:
        return f" [clearable in the experiment folder ({PROVEN[code][0]}): reference fix tested]"
    if code in NOT_YET_SHOWN:
        return " [experiment-folder fix not yet shown by a test]"
    if code in LEDGER_PATCH:
        return " [not an experiment-folder fix: a temporary patch through the ledger, reverted before the phase passes]"
    return ""
