"""add-moe-model phase costs against their floors, measured side by side in one run.

    python bench/bench_add_moe.py [--repeat 2] [--target PATH]

--target runs both against a torchtitan git checkout (e.g. the main snapshot of
../shared/targets): every start gets its own clone of it, the floors import that tree.
Where the tree ships the skill's numerical_equivalence.py the numerics phase also runs it,
so the numerics floor then adds one bare run of that script.

1. probe: `orchestrator advance --max-phases 2` (pre-flight + probe of DeepSeek-V3) vs a bare
   `python -c` that imports the experiment package and builds the full DeepSeek-V3 config
   (61 layers, 256 experts) on meta.                                     goal <= 1.3x
2. numerics: the numerics phase of Qwen3-30B-A3B's synthetic config vs a bare `python -c`
   that imports the same modules and runs the HF block and the Titan MoE forward once in
   each of the two dtypes.                                                goal <= 1.5x, < 60 s
3. survey (`--survey MODELS|all`, or `--survey-out DIR --survey-state DIR` to read a finished
   one): the whole `orchestrator survey add-moe-model` against its floor, one warm import plus
   the worker time each model's build and compare took (every worker call of every run,
   from the trail).                              goal: all on 2 cores within 25 min (10 min)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROBE_FLOOR = """
import torch
import torchtitan.experiments.transformers_modeling_backend.moe_replacement
import torchtitan.experiments.transformers_modeling_backend.state_dict_adapter
from transformers import AutoConfig, AutoModelForCausalLM
import json
models = json.load(open('phases/kit/registry.json'))['models']
entry = [m for m in models if m['model_type'] == 'deepseek_v3'][0]
config = AutoConfig.for_model('deepseek_v3', **{k: v for k, v in entry['config'].items() if k != 'model_type'})
with torch.device('meta'):
    AutoModelForCausalLM.from_config(config)
"""
NUMERICS_FLOOR = """
import torch
from torchtitan.experiments.transformers_modeling_backend.moe_replacement import _build_moe_config, _probe_hf_moe_block
from torchtitan.experiments.transformers_modeling_backend.state_dict_adapter import hf_to_titan_moe_state_dict
from transformers import AutoConfig, AutoModelForCausalLM
import sys, json
entry = json.loads(sys.argv[1])
config = AutoConfig.for_model(**entry)
config._experts_implementation = 'grouped_mm'
model = AutoModelForCausalLM.from_config(config).to(torch.bfloat16).eval()
block = model.model.layers[0].mlp
config.load_balance_coeff = None
config.comm_backend = 'standard'
params = _probe_hf_moe_block(block, config)
with torch.device('meta'):
    titan = _build_moe_config(params, config).build()
titan.to_empty(device='cpu'); titan.init_states(buffer_device=torch.device('cpu'))
sd = hf_to_titan_moe_state_dict({f'mlp.{k}': v for k, v in block.state_dict().items()})
titan.load_state_dict({k.removeprefix('mlp.'): v for k, v in sd.items()}, strict=False)
from phases.add_moe_model.work.layout import detect_moe_layout
layout = detect_moe_layout(titan, hidden=config.hidden_size)
x = torch.randn(2, 16, config.hidden_size)
with torch.no_grad():
    for dtype in (torch.bfloat16, torch.float32):
        block.to(dtype); titan.to(dtype)
        block(x.to(dtype)); titan(layout.tokens(x.to(dtype)))
"""
NE = ("torchtitan/experiments/transformers_modeling_backend/.claude/skills/add_moe_model/scripts/"
      "numerical_equivalence.py")


def seconds(command: list[str], *, tree: Path | None = None, cwd: Path = ROOT,
            ok: tuple[int, ...] = (0, 3, 4)) -> float:
    """Wall time of a command; ``tree`` first on PYTHONPATH (the target's torchtitan, then this project)."""
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(tree), str(ROOT), env.get("PYTHONPATH", "")])
    started = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, env=env)
    if done.returncode not in ok:
        raise SystemExit(f"{command[:4]} failed ({done.returncode}): {done.stderr[-800:]}")
    return time.perf_counter() - started


def cli(*args: str, state: Path) -> list[str]:
    return [sys.executable, "-m", "orchestrator.cli", *args, "--state-dir", str(state)]


def start(model: str, state: Path, target: Path | None) -> str:
    where = ["--target", str(fresh_clone(target, state))] if target else []
    out = subprocess.run(cli("start", "add-moe-model", "--model", model, "--branch", "current", "--commit",
                             "never", *where, "--json", state=state), cwd=ROOT, capture_output=True, text=True)
    return json.loads(out.stdout)["run_id"]


def survey_against_floor(out: Path, state: Path) -> str:
    """The survey's wall time against its floor: one warm import plus the worker time of its runs; with
    ``--jobs N`` (OUT/jobs.json) the slowest task's import plus worker time, the critical path."""
    if not (out / "survey.json").is_file():
        done = sum(len(json.loads(f.read_text())["rows"]) for f in out.glob("tasks/*/survey.json"))
        return f"survey did not finish: no {out / 'survey.json'}; {done} row(s) in its tasks so far"
    body = json.loads((out / "survey.json").read_text())
    plan = json.loads((out / "jobs.json").read_text()) if (out / "jobs.json").is_file() else None
    tasks = [out / "tasks" / str(i) for i in range(len(plan["chunks"]))] if plan else [out]
    paths = []
    for task in tasks:
        saved = json.loads((task / "survey.json").read_text())
        worker = sum(worker_seconds(state, row["run_id"]) for row in saved["rows"] if row["run_id"])
        paths.append(((saved.get("warm_import_s") or 0.0) + worker, saved.get("warm_import_s"), worker))
    floor, warm, worker = max(paths)
    summed = sum(p[2] for p in paths)
    side = f"{len(tasks)} tasks side by side, the slowest: " if plan else ""
    return (f"survey ({len(body['rows'])} model types, {body['counts']}): {body['seconds']:.0f} s "
            f"({body['seconds'] / 60:.1f} min) vs floor {floor:.0f} s ({side}one import {warm} s + "
            f"worker time {worker:.0f} s; all tasks' worker time {summed:.0f} s) -> {body['seconds'] / floor:.2f}x "
            f"(goal: <= 10 min on one H200, <= 25 min on 2 CPU cores)")


def worker_seconds(state: Path, run_id: str) -> float:
    events = (state / "runs" / run_id / "events.jsonl").read_text().splitlines()
    return sum(e["data"]["seconds"] for e in map(json.loads, events) if e["type"] == "worker_finished")


def run_survey(models: str) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        state, out = Path(tmp, "state"), Path(tmp, "out")
        subprocess.run(cli("survey", "add-moe-model", "--models", models, "--device", "cpu", "--out", str(out),
                           "--json", state=state), cwd=ROOT, capture_output=True, check=False)
        return survey_against_floor(out, state)


def fresh_clone(target: Path, state: Path) -> Path:
    dest = Path(tempfile.mkdtemp(prefix="tt-", dir=state))
    subprocess.run(["git", "clone", "-q", str(target), str(dest)], check=True)
    return dest


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--survey", metavar="MODELS", help="run the survey (all, or types) and time it")
    parser.add_argument("--survey-out", type=Path, help="read a finished survey's survey.json instead")
    parser.add_argument("--survey-state", type=Path, help="its state dir (the runs' trails)")
    parser.add_argument("--target", type=Path, help="a torchtitan git checkout (default: the embedded workspace)")
    args = parser.parse_args()
    if args.survey or args.survey_out:
        print(survey_against_floor(args.survey_out, args.survey_state) if args.survey_out else run_survey(args.survey))
        return
    tree = args.target.resolve() if args.target else None
    print(f"target: {tree or 'embedded (installed torchtitan)'}")
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp)
        floors, probes = [], []
        for _ in range(args.repeat):
            floors.append(seconds([sys.executable, "-c", PROBE_FLOOR], tree=tree))
            probes.append(seconds(cli("advance", start("deepseek-ai/DeepSeek-V3", state, tree), "--max-phases", "2",
                                      state=state)))
        floor, probe = statistics.median(floors), statistics.median(probes)
        print(f"probe phase (DeepSeek-V3, through the CLI): {probe:.1f} s vs floor {floor:.1f} s "
              f"-> {probe / floor:.2f}x (goal <= 1.3x)")
        run_id = start("Qwen/Qwen3-30B-A3B", state, tree)
        subprocess.run(cli("advance", run_id, "--max-phases", "3", state=state), cwd=ROOT, capture_output=True)
        entry = json.loads((state / "runs" / run_id / "run.json").read_text())["results"]["synthetic_config"]["entry"]
        numerics_floor = seconds([sys.executable, "-c", NUMERICS_FLOOR, json.dumps(entry)], tree=tree)
        if tree is not None and (tree / NE).is_file():
            script = seconds([sys.executable, NE, "--models", "qwen3_moe", "--device", "cpu"], tree=tree, cwd=tree,
                             ok=(0, 1))
            print(f"bare run of the tree's numerical_equivalence.py (qwen3_moe, CPU): {script:.1f} s")
            numerics_floor += script
        numerics = seconds(cli("advance", run_id, "--max-phases", "1", state=state))
        print(f"numerics phase (Qwen3 synthetic, CPU, bf16 + fp32): {numerics:.1f} s vs floor {numerics_floor:.1f} s "
              f"-> {numerics / numerics_floor:.2f}x (goal <= 1.5x and < 60 s)")


if __name__ == "__main__":
    main()
