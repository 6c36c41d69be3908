"""What one agent tool call costs, three ways: in a thread of this process, in a child forked from it, in a fresh
interpreter (``status``, ``explain``, ``read_file`` on the first run of STATE_DIR; medians of 7 after one warm call).

The MCP server forks each call from a process that imported the tools once (``orchestrator/agent/call_server.py``);
this prints what that costs against the thread it replaced and against a fresh interpreter per call.

    python bench/bench_mcp_call_cost.py STATE_DIR     (a state dir holding an add-moe-model run)
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from orchestrator.agent.tools import call_tool
from orchestrator.trail.store import RunStore

STATE = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("state")
READ = "torchtitan/experiments/transformers_modeling_backend/model.py"
FRESH = ("import sys, json; from orchestrator.agent.tools import call_tool; from orchestrator.trail.store import "
         "RunStore; print(call_tool(sys.argv[1], json.loads(sys.argv[2]), store=RunStore(sys.argv[3]), "
         "call_id='bench').status)")


def in_thread(name: str, args: dict[str, Any]) -> None:
    call_tool(name, args, store=RunStore(STATE), call_id="bench")


def forked(name: str, args: dict[str, Any]) -> None:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        os.write(write, call_tool(name, args, store=RunStore(STATE), call_id="bench").model_dump_json().encode())
        os._exit(0)
    os.close(write)
    while os.read(read, 1 << 16):
        pass
    os.close(read)
    os.waitpid(pid, 0)


def fresh(name: str, args: dict[str, Any]) -> None:
    subprocess.run([sys.executable, "-c", FRESH, name, json.dumps(args), str(STATE)], capture_output=True, check=True)


def main() -> None:
    run_id = sorted(p.name for p in (STATE / "runs").iterdir() if not p.name.startswith("."))[0]
    calls = [("status", {"run_id": run_id}), ("explain", {"run_id": run_id}),
             ("read_file", {"run_id": run_id, "path": READ})]
    in_thread("explain", calls[1][1])  # the imports a server has paid by its first call
    print(f"load average {os.getloadavg()}")
    for way in (in_thread, forked, fresh):
        for name, args in calls:
            times = []
            for _ in range(7):
                started = time.perf_counter()
                way(name, args)
                times.append((time.perf_counter() - started) * 1000)
            print(f"{way.__name__:9s} {name:9s} median {statistics.median(times):6.1f} ms "
                  f"(min {min(times):.1f}, max {max(times):.1f})")


if __name__ == "__main__":
    main()
