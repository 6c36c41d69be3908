from orchestrator.phase_api import PhaseResult
from tests.toyflow.worker_fns import SQUARE


def run(ctx):
    ctx.plan(1)
    answer = ctx.call(SQUARE, {"n": 7, "mode": ctx.options["worker"], "sleep": ctx.options["sleep"],
                               "marker": ctx.options["marker"]}).model_dump()
    ctx.write_artifact("square.json", f'{{"square": {answer["square"]}}}\n')
    ctx.record_measurement(name="square", unit="1", samples=[answer["square"]], provenance={"command": "square"})
    return PhaseResult(outcome="passed", summary=f"7^2 = {answer['square']}", data=answer)
