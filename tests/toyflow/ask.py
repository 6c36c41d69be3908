from orchestrator.phase_api import PhaseResult, Question


def run(ctx):
    if "color" not in ctx.answers:
        return PhaseResult(outcome="needs_human", summary="which color?",
                           questions=(Question(key="color", prompt="Pick a color", choices=("red", "blue")),))
    return PhaseResult(outcome="passed", summary=f"color {ctx.answers['color']}", data={"color": ctx.answers["color"]})


def take_results(state, directory):
    """Hand-back hook: ``DIR/color.txt`` answers the color question (the engine's --results path)."""
    from orchestrator.errors import UsageError
    from orchestrator.phase_api import HandBack

    path = directory / "color.txt"
    if not path.is_file():
        raise UsageError(f"{directory} has no color.txt")
    color = path.read_text().strip()
    return HandBack(summary=f"color {color} from {directory}", artifacts={"handed/color.txt": color + "\n"},
                    records=(("color_row", {"color": color}),), answers={"color": color})
