from orchestrator.phase_api import PhaseResult, Question


def run(ctx):
    if "color" not in ctx.answers:
        return PhaseResult(outcome="needs_human", summary="which color?",
                           questions=(Question(key="color", prompt="Pick a color", choices=("red", "blue")),))
    return PhaseResult(outcome="passed", summary=f"color {ctx.answers['color']}", data={"color": ctx.answers["color"]})
