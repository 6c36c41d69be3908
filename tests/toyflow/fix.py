from orchestrator.phase_api import Issue, PhaseResult


def run(ctx):
    if not (ctx.target / "allowed" / "fixed.txt").exists():
        return PhaseResult(outcome="needs_agent", summary="waiting for allowed/fixed.txt",
                           issues=(Issue(code="missing_fix", message="allowed/fixed.txt is missing",
                                         fix_location="allowed/fixed.txt"),))
    return PhaseResult(outcome="passed", summary="fixed")
