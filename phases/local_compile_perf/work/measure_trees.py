"""One tree at several token counts in one fresh process, and the 3-process confirmation.

``python -m phases.local_compile_perf.work.measure_trees --request FILE`` measures one tree
(eager, upstream, per_layer or regions:a,b) at each token count with the kit's
``measure_tree`` and prints one ``RESULT {json}`` line. Dynamo is reset between token
counts, so each count compiles its own graph as a fresh process would (the Inductor cache
stays warm, which keeps cold compiles out of the later counts).

``confirm_variants_worker`` runs that script ``runs`` times per variant, each run a fresh
process started in the variant's checkout, interleaving variants and rotating their order
every round (kit confirm.run_once: RESULT parsed from the run's own output, FAILED marker
otherwise, nvidia-smi polled for foreign processes). Only stdlib and pydantic are imported
by the worker; the children import torch.

With a ``journal`` file, each run is written there as it ends, and a rerun of the same request on
the same machine (boot and GPU) reads those runs back instead of measuring them again, then goes
on in the same interleaved order: a phase cut at a device call's limit loses only the run that was
in flight. The answer lists what it read back (``carried``), so the trail says which rows straddle
the cut.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from phases.kit.harness import HarnessRequest, TimingKnobs

RESULT_PREFIX = "RESULT "


class TreeRequest(HarnessRequest):
    """One tree at several token counts (the script's input)."""

    tree: str
    tokens: tuple[int, ...]
    timing: TimingKnobs
    ac_mode: str | None = None
    lean: bool = False
    """Time the steps only: no profile, no CUDA-graph replay (Variant.lean)."""


class Variant(BaseModel):
    """A named tree in a checkout, measured at ``tokens``."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str
    """E.g. "eager", "stack", "candidate"."""
    checkout: str
    tree: str
    tokens: tuple[int, ...]
    ac_mode: str | None = None
    """Activation checkpointing (none, full, selective); None = the harness's recipe mode."""
    env: dict[str, str] = {}
    """Set in this variant's fresh processes only (e.g. TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 for a cold compile)."""
    lean: bool = False
    """Time the first call and the steps only, no kernel profile and no CUDA-graph replay: a cold-compile run,
    which reads its compile from the first call, needs neither (each cost seconds a process)."""


class ConfirmRequest(HarnessRequest):
    variants: tuple[Variant, ...]
    timing: TimingKnobs
    runs: int = 3
    timeout_s: float = 1200.0
    journal: str = ""
    """JSON-lines file of finished runs ("" = none): read back on a rerun of this request on this machine."""

    def key(self) -> str:
        """What a journal entry must match to be read back: the request without its journal path."""
        text = json.dumps(self.model_dump(mode="json", exclude={"journal"}), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


class VariantRuns(BaseModel):
    """Every fresh-process run of one variant (ok or FAILED), in run order."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    variant: Variant
    command: tuple[str, ...]
    runs: tuple[dict[str, Any], ...]
    """kit RunOutcome dumps; an ok run's ``result`` maps str(tokens) -> MeasureResult."""


class ConfirmResponse(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    variants: tuple[VariantRuns, ...]
    orders: tuple[tuple[str, ...], ...]
    gpu_poll: str
    """"nvidia-smi" or why polling was not possible."""
    carried: tuple[str, ...] = ()
    """Runs read back from the journal ("variant#index"), measured on this machine by an attempt that was cut."""
    machine: str = ""
    """The boot and GPU the runs were measured on (what a journal entry must match)."""


def measure_tokens(req: TreeRequest) -> dict[str, Any]:
    """Measure ``req.tree`` at every token count; {str(tokens): MeasureResult dump}."""
    import torch._dynamo

    from orchestrator.progress import report
    from phases.kit.measure_once import MeasureRequest, measure_tree

    results = {}
    for tokens in req.tokens:
        torch._dynamo.reset()
        report(f"measuring {req.tree} at {tokens} tokens")
        result = measure_tree(MeasureRequest(
            harness=req.harness, tree=req.tree, tokens=tokens, device=req.device, timing=req.timing,
            seed=req.seed, cuda_graph=not req.lean, profile=not req.lean, ac_mode=req.ac_mode,
            target=os.getcwd(), command=" ".join([sys.executable, "-m", __name__, *sys.argv[1:]])))
        results[str(tokens)] = result.model_dump(mode="json")
    return results


def build_command(request_path: Path) -> list[str]:
    return [sys.executable, "-m", "phases.local_compile_perf.work.measure_trees", "--request", str(request_path)]


def confirm_variants_worker(request: dict) -> dict:
    """Worker entry: ``ConfirmRequest`` -> ``ConfirmResponse`` (see the module docstring)."""
    from orchestrator.progress import Eta, report
    from phases.kit.confirm import probe_gpu_pids, run_once
    from phases.kit.screen import rotated_orders

    req = ConfirmRequest.model_validate(request)
    poll = probe_gpu_pids() is not None
    by_name = {v.name: v for v in req.variants}
    orders = rotated_orders(list(by_name), req.runs)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in by_name}
    commands: dict[str, list[str]] = {}
    from phases.kit.confirm import machine_id

    machine = machine_id()
    done = read_journal(req.journal, key=req.key(), machine=machine) if req.journal else {}
    carried = []
    with tempfile.TemporaryDirectory(prefix="lcp-confirm-") as tmp:
        for name, variant in by_name.items():
            path = Path(tmp, f"{name}.json")
            path.write_text(TreeRequest(harness=req.harness, tree=variant.tree, tokens=variant.tokens,
                                        device=req.device, timing=req.timing, seed=req.seed,
                                        ac_mode=variant.ac_mode, lean=variant.lean).model_dump_json())
            commands[name] = build_command(path)
        eta = Eta(len(orders) * len(by_name) - len(done))
        for index, order in enumerate(orders):
            for name in order:
                if (name, index) in done:
                    runs[name].append(done[name, index])
                    carried.append(f"{name}#{index}")
                    continue
                eta.report(f"fresh process {index + 1}/{req.runs} of {name} at {list(by_name[name].tokens)} tokens")
                runs[name].append(_run_in(by_name[name], commands[name], index=index, poll=poll,
                                          timeout_s=req.timeout_s, run_once=run_once))
                if req.journal:
                    write_journal(req.journal, key=req.key(), machine=machine, variant=name, index=index,
                                  outcome=runs[name][-1])
                eta.step_done()
    return ConfirmResponse(
        variants=tuple(VariantRuns(variant=by_name[n], command=tuple(commands[n]), runs=tuple(runs[n]))
                       for n in by_name),
        orders=orders, gpu_poll="nvidia-smi" if poll else "not applicable: nvidia-smi not available (no GPU)",
        carried=tuple(carried), machine=machine,
    ).model_dump(mode="json")


def read_journal(path: str, *, key: str, machine: str) -> dict[tuple[str, int], dict[str, Any]]:
    """Finished runs of request ``key`` on ``machine``, by (variant, index); a torn last line is skipped."""
    done: dict[tuple[str, int], dict[str, Any]] = {}
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return done
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("key") == key and entry.get("machine") == machine:
            done[entry["variant"], entry["index"]] = entry["outcome"]
    return done


def write_journal(path: str, *, key: str, machine: str, variant: str, index: int, outcome: dict[str, Any]) -> None:
    """Append one finished run, flushed to disk before the next run starts."""
    line = json.dumps({"key": key, "machine": machine, "variant": variant, "index": index, "outcome": outcome},
                      sort_keys=True)
    with open(path, "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def _run_in(variant: Variant, command: list[str], *, index: int, poll: bool, timeout_s: float,
            run_once: Any) -> dict:
    """One fresh process with cwd and PYTHONPATH on the variant's checkout (never the main checkout by accident)."""
    here, checkout = os.getcwd(), variant.checkout
    project = str(Path(__file__).resolve().parents[3])
    env = {**variant.env,
           "PYTHONPATH": os.pathsep.join(filter(None, [checkout, project, os.environ.get("PYTHONPATH")]))}
    os.chdir(checkout)
    try:
        return run_once(command, index=index, env=env, poll_gpu=poll, timeout_s=timeout_s).model_dump(mode="json")
    finally:
        os.chdir(here)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m phases.local_compile_perf.work.measure_trees")
    parser.add_argument("--request", required=True, help="JSON file holding a TreeRequest")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    req = TreeRequest.model_validate_json(Path(args.request).read_text())
    print(RESULT_PREFIX + json.dumps(measure_tokens(req), sort_keys=True), flush=True)


if __name__ == "__main__":
    main()
