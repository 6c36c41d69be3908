"""Parallel tool calls over one ``orchestrator mcp``: N add-moe-model runs advanced at once vs one after another.

Starts 2N runs (``type:MODEL`` for each of the N model types, twice; CPU, torchrun rows skipped), a person's
branch and commit answers recorded for each, then through one MCP server and one real client:
serial   the first N runs, each advanced call by call through probe, synthetic config and numerics, one run
         after the other;
parallel the other N runs, the same calls sent for all N at once, phase by phase.
Prints each way's wall time and the ratio, with the host's load average before and after (these machines are
shared). Every call must answer ok.

    python bench/bench_mcp_parallel.py [--models qwen3_moe,granitemoe,hunyuan_v1_moe,glm4_moe]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parent.parent
PHASES = 3  # preflight's answers are in: probe, synthetic_config, numerics; one advance each (plus preflight)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="qwen3_moe,granitemoe,hunyuan_v1_moe,glm4_moe")
    models = parser.parse_args().models.split(",")
    with tempfile.TemporaryDirectory(prefix="bench-mcp-") as tmp:
        print(f"load average before: {os.getloadavg()}")
        timings = anyio.run(measure, Path(tmp) / "state", models)
        print(f"load average after: {os.getloadavg()}")
    serial, parallel = timings["serial"], timings["parallel"]
    print(f"{len(models)} runs x {PHASES + 1} advances: serial {serial:.1f} s, parallel {parallel:.1f} s "
          f"-> parallel/serial {parallel / serial:.2f}")


async def measure(state: Path, models: list[str]) -> dict[str, float]:
    from mcp import Client, StdioServerParameters

    from orchestrator import engine
    from orchestrator.trail.store import RunStore

    params = StdioServerParameters(command=sys.executable, cwd=str(ROOT), env=dict(os.environ),
                                   args=["-m", "orchestrator.cli", "mcp", "--state-dir", str(state)])
    store = RunStore(state)
    async with Client(params, read_timeout_seconds=3600) as client:
        runs = []
        for model in models * 2:
            options = {"model": f"type:{model}", "device": "cpu", "torchrun_rows": "skip"}
            answer = await client.call_tool("start_run", {"workflow": "add-moe-model", "options": options})
            run_id = json.loads(answer.content[0].text)["data"]["run_id"]
            engine.resume(run_id, {"branch": "current", "commit": "never"}, store=store, advance_after=False)
            runs.append(run_id)
        started = time.monotonic()
        for run_id in runs[:len(models)]:
            for _ in range(PHASES + 1):
                await advance(client, run_id)
        serial = time.monotonic() - started
        started = time.monotonic()
        for _ in range(PHASES + 1):
            async with anyio.create_task_group() as group:
                for run_id in runs[len(models):]:
                    group.start_soon(advance, client, run_id)
        parallel = time.monotonic() - started
    return {"serial": serial, "parallel": parallel}


async def advance(client: Any, run_id: str) -> None:
    answer = json.loads((await client.call_tool("advance", {"run_id": run_id})).content[0].text)
    if answer["status"] not in ("ok", "waiting_for_human"):
        raise SystemExit(f"advance {run_id}: {answer['status']}: {answer['message']}")


if __name__ == "__main__":
    main()
