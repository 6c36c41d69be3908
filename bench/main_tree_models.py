"""add-moe-model on torchtitan main for the 8 models of its MODEL_COMPATIBILITY.md, side by side with upstream.

    python bench/main_tree_models.py run --tree CHECKOUT --state DIR [--models ID ...] [--jobs N] [--device cuda]
    python bench/main_tree_models.py table --tree CHECKOUT --state DIR

``run`` gives every model a fresh clone of CHECKOUT (a git repo of the main snapshot, see
../shared/targets/README.md) and runs the workflow (CPU by default; ``--jobs N``: models side by
side). Where the run stops for a person,
its decisions are taken as a user would, and each is written to ``<slug>.steps``:
- human, probe blocker (core changes): continue anyway, as upstream kept Gemma-4 in its table;
- human, torchrun rows this GPU-less machine cannot run: accept them as unrun;
- agent, two probe findings it can fix inside the experiment folder, each from the probe's own
  message: the correction-bias key the adapter misnames, and projections tested with
  ``hasattr`` that HF sets to None.
A run that stops before numerics (Gemma-4: core gaps, then an adapter that cannot map its
layer-level keys) also gets the numerics worker alone on upstream's own ``_MODEL_CONFIGS`` entry
(``<slug>.direct.json``), so its KL can still stand beside upstream's, labelled as such.
``table`` prints the markdown table of docs/add-moe-model-main.md: upstream's status and KL
(parsed from the checkout's MODEL_COMPATIBILITY.md) next to ours, with where each run ended.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXP = "torchtitan/experiments/transformers_modeling_backend/"
MODELS = {"qwen3_moe": "Qwen/Qwen3-30B-A3B", "mixtral": "mistralai/Mixtral-8x7B-v0.1",
          "deepseek_v3": "deepseek-ai/DeepSeek-V3", "olmoe": "allenai/OLMoE-1B-7B-0924",
          "deepseek_v2": "deepseek-ai/DeepSeek-V2-Lite", "glm4_moe": "type:glm4_moe",
          "glm_moe_dsa": "type:glm_moe_dsa", "gemma4_text": "google/gemma-4-26B-A4B"}


def slug(model: str) -> str:
    return re.sub(r"[/:]", "_", model)


def cli(*args: str, state: Path) -> dict:
    done = subprocess.run([sys.executable, "-m", "orchestrator.cli", *args, "--state-dir", str(state), "--json"],
                          cwd=ROOT, capture_output=True, text=True)
    lines = done.stdout.strip().splitlines()
    return {"code": done.returncode, **(json.loads(lines[-1]) if lines else {"error": done.stderr[-2000:]})}


def run_model(model: str, *, tree: Path, state: Path, device: str = "cpu") -> dict:
    target = state / f"tt-{slug(model)}"
    subprocess.run(["git", "clone", "-q", str(tree), str(target)], check=True)
    status = cli("run", "add-moe-model", "--model", model, "--target", str(target), "--branch", "new",
                 "--commit", "auto", "--device", device, state=state)
    steps = []
    for _ in range(6):
        pending = {q["key"] for q in status.get("pending", [])} if status["code"] == 3 else set()
        if "probe_blocker" in pending:
            steps.append("human: probe_blocker=continue_anyway (core gaps stay recorded)")
            status = cli("resume", status["run_id"], "--answer", "probe_blocker=continue_anyway", state=state)
            continue
        if "unrun_rows" in pending:
            steps.append("human: unrun_rows=accept (rows that need more GPUs than this machine has)")
            status = cli("resume", status["run_id"], "--answer", "unrun_rows=accept", state=state)
            continue
        fixed = agent_fix(status, target) if status["code"] == 4 else []
        if not fixed:
            break
        steps += [f"agent: {f}" for f in fixed]
        status = cli("advance", status["run_id"], state=state)
    (state / f"{slug(model)}.steps").write_text("".join(f"{s}\n" for s in steps))
    (state / f"{slug(model)}.json").write_text(json.dumps(status, indent=2) + "\n")
    if status.get("phase") in ("preflight", "probe", "synthetic_config"):
        model_type = next(t for t, m in MODELS.items() if m == model)
        direct = direct_numerics(tree, model_type, device=device)
        (state / f"{slug(model)}.direct.json").write_text(json.dumps(direct, indent=2))
    return status


def direct_numerics(tree: Path, model_type: str, *, device: str = "cpu") -> dict:
    """The numerics worker alone, on upstream's ``_MODEL_CONFIGS`` entry for ``model_type``."""
    sys.path.insert(0, str(ROOT))
    from orchestrator.worker import run_worker
    from phases.add_moe_model.config_entry import find_model_configs
    from phases.add_moe_model.tree_scripts import NE_PATH

    configs = find_model_configs((tree / NE_PATH).read_text())
    entry = next({kw.arg: ast.literal_eval(kw.value) for kw in value.keywords}
                 for key, value in zip(configs.keys, configs.values) if key.value == model_type)
    request = {"model_type": model_type, "config_kwargs": entry, "dtypes": ["bfloat16"], "device": device}
    return run_worker("phases.add_moe_model.work.numerics:compare_dtypes", request, target=tree).answer


def agent_fix(status: dict, target: Path) -> list[str]:
    """The fixes an agent makes in the experiment folder for the probe findings named here."""
    if status.get("phase") != "probe":
        return []
    issues = {i["code"]: i["message"] for i in status.get("issues", [])}
    done = []
    bias = re.search(r"maps gate\.e_score_correction_bias to \S+\.(\w+) but the Titan MoE stores it as \S+\.(\w+);",
                     issues.get("router_bias_key_misnamed", ""))
    if bias:
        old, new = bias.groups()
        edit(target / EXP / "state_dict_adapter.py", {rf'r"\1{old}"': rf'r"\1{new}"',
                                                      rf'r"^(.*\.){old}$"': rf'r"^(.*\.){new}$"'})
        done.append(f"state_dict_adapter.py maps the correction bias to {new} (was {old}), both directions")
    none = re.search(r"None children (\[.*?\])", issues.get("attention_projection_unhandled", ""))
    if none:
        names = ast.literal_eval(none.group(1))
        edit(target / EXP / "hf_sharding.py", {f'hasattr(attn, "{n}")': f'getattr(attn, "{n}", None) is not None'
                                              for n in names})
        done.append(f"hf_sharding.py tests {names} with getattr(...) is not None, not hasattr")
    return done


def edit(path: Path, replacements: dict[str, str]) -> None:
    text = path.read_text()
    new = text
    for old, replacement in replacements.items():
        new = new.replace(old, replacement)
    if new == text:
        raise SystemExit(f"{path}: none of {list(replacements)} found; fix it by hand")
    path.write_text(new)


def upstream_rows(tree: Path) -> dict[str, list[str]]:
    text = (tree / EXP / "MODEL_COMPATIBILITY.md").read_text()
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in text.splitlines()
            if line.startswith("| ") and not line.startswith("| Model")]
    return {cells[1]: cells for cells in rows if len(cells) == 7}


def ours(state: Path, model: str) -> dict:
    if not (state / f"{slug(model)}.json").is_file():
        return {"numerics": None, "steps": [], "ended": "not run (or cut off before its end)"}
    status = json.loads((state / f"{slug(model)}.json").read_text())
    trail = [json.loads(line) for line in (state / "runs" / status["run_id"] / "events.jsonl").read_text().splitlines()]
    done = {e["phase"]: e["data"]["data"] for e in trail if e["type"] == "phase_completed"}
    steps = (state / f"{slug(model)}.steps").read_text().strip().splitlines()
    return {"status": status, "numerics": done.get("numerics"), "steps": steps,
            "ended": f"{status['phase']} ({status['status']})", "run_id": status["run_id"]}


def table(tree: Path, state: Path) -> str:
    upstream = upstream_rows(tree)
    lines = ["| Model | model_type | Upstream status | Upstream KL | Our status | Our KL | Firmness | Our cos | "
             "Device | Tree script | Run ended | Steps taken |", "|" + "---|" * 12]
    for model_type, model in MODELS.items():
        row, mine = upstream.get(model_type, ["?"] * 7), ours(state, model)
        numerics = mine["numerics"] or {}
        verdict = numerics.get("verdict") or {}
        script = (numerics.get("tree_script") or {}).get("status", "not run")
        direct = state / f"{slug(model)}.direct.json"
        if not verdict and direct.is_file():
            verdict = json.loads(direct.read_text())["results"][0]
            verdict["status"] += " (worker alone, upstream's entry)"
        kl = f"{verdict['kl']:.2e}" if isinstance(verdict.get("kl"), float) else "-"
        cos = f"{verdict['cos_sim']:.6f}" if isinstance(verdict.get("cos_sim"), float) else "-"
        lines.append(f"| {row[0]} | {model_type} | {row[2]} | {row[3]} | {verdict.get('status', '-')} | {kl} | "
                     f"{firmness(verdict)} | {cos} | "
                     f"{verdict.get('device', '-')} | {script} | {mine['ended']} | {'; '.join(mine['steps']) or '-'} |")
    return "\n".join(lines) + "\n"


def firmness(verdict: dict) -> str:
    """fp64 KL, one-ulp spread and the tier they span, as the numerics phase recorded them."""
    firm = verdict.get("firmness") or {}
    if firm.get("kl_fp64") is None:
        return firm.get("error") or "-"
    spread = f", spread {firm['spread']:.1e}" if isinstance(firm.get("spread"), float) else ""
    return f"fp64 {firm['kl_fp64']:.2e}{spread}; {firm.get('edge') or verdict.get('status')}"


def run_all(models: list[str], *, tree: Path, state: Path, device: str, jobs: int) -> None:
    from concurrent.futures import ThreadPoolExecutor

    def one(model: str) -> str:
        status = run_model(model, tree=tree, state=state, device=device)
        return f"{model}: {status.get('phase')} {status.get('status')}: {status.get('summary')}"

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for line in pool.map(one, models):
            print(line, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=("run", "table"))
    parser.add_argument("--tree", type=Path, required=True, help="git checkout of the main snapshot")
    parser.add_argument("--state", type=Path, required=True)
    parser.add_argument("--models", nargs="*", default=list(MODELS.values()))
    parser.add_argument("--device", default="cpu", help="cpu, or cuda on a GPU machine (bench/h200_matrix.sh)")
    parser.add_argument("--jobs", type=int, default=1, help="models run side by side (each its own processes)")
    args = parser.parse_args()
    if args.command == "run":
        args.state.mkdir(parents=True, exist_ok=True)
        run_all(args.models, tree=args.tree.resolve(), state=args.state.resolve(), device=args.device, jobs=args.jobs)
    else:
        print(table(args.tree, args.state), end="")


if __name__ == "__main__":
    main()
