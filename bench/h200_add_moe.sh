#!/usr/bin/env bash
# One device call: the whole add-moe-model workflow for several registry models on CUDA.
#   MODELS="Qwen/Qwen3-30B-A3B allenai/OLMoE-1B-7B-0924 mistralai/Mixtral-8x7B-v0.1" \
#   DEADLINE_S=480 bash bench/h200_add_moe.sh
# Each model is `orchestrator start add-moe-model --device cuda --branch current --commit never`
# (one at a time: the first makes the pristine workspace), then all runs advance side by side
# until done or waiting, each under DEADLINE_S: numerics on CUDA, the sharding build check, and
# the torchrun rows on the visible GPUs (the 1-GPU FSDP row trains; on torch < 2.14 the
# world-size > 1 rows FAIL with the torch root cause). Then every run is audited.
# Missing pure-Python wheels (torchtitan, pydantic, ...) are read from $WHEELS (default ../whl:
# the carried folder holds src/ = this checkout and whl/). Results: $OUT/state.tgz (runs with
# their trails and artifacts, no workspaces), $OUT/log_<n>.txt per run, $OUT/env.txt.
# The device copies the session's checkout, so carry this one in an ignored folder, e.g.
#   D=state/workspaces/add-moe-dev; mkdir -p $D/src $D/whl
#   git ls-files -co --exclude-standard | xargs cp --parents -t $D/src
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux2014_x86_64 -d $D/whl torchtitan==0.3.0 spmd_types==0.2.3 torch_checkpointing==0.1.1 \
#     tyro==1.0.17 docstring_parser==0.18.0 typeguard==4.6.1 torchdata==0.11.0 datasets==4.7.0 dill==0.4.0 \
#     multiprocess==0.70.18 fsspec==2026.2.0 pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 \
#     typing-inspection==0.4.5 typing_extensions==4.16.0 GitPython==3.2.1 gitdb==4.0.12 smmap==5.0.3 \
#     transitions==0.9.3 orjson==3.13.0 jsonschema==4.26.0 jsonschema-specifications==2025.9.1 \
#     referencing==0.37.0 rpds-py==2026.9.1 PyNaCl==1.6.2 cffi==2.1.1 pycparser==3.12 liger_kernel==0.8.5 packaging==26.4
# and run `cd $D/src && bash bench/h200_add_moe.sh` with carry [$D] (about 10 MiB).
set -uo pipefail
out=${OUT:-/tmp/h200-add-moe-out}
mkdir -p "$out"
source "$(dirname "$0")/device_env.sh"
read -r -a models <<< "${MODELS:-Qwen/Qwen3-30B-A3B allenai/OLMoE-1B-7B-0924 mistralai/Mixtral-8x7B-v0.1}"
state=${STATE_DIR:-/tmp/h200-add-moe-state}
# The trail key and signed heads travel with the trail, so `audit` checks the anchor here too
# (a key beside the trail proves consistency with what the engine signed, not secrecy).
export ORCHESTRATOR_ANCHOR_DIR=${ORCHESTRATOR_ANCHOR_DIR:-$state/anchors}
deadline=${DEADLINE_S:-480}
device=${DEVICE:-cuda}
{
  date -u; nvidia-smi -L 2>&1; python3 --version
  python3 -c 'import torch, transformers, torchtitan as tt
print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count(),
      "transformers", transformers.__version__, "torchtitan", tt.__version__)' 2>&1 | tail -1
} > "$out/env.txt" 2>&1
cat "$out/env.txt"
started=$SECONDS
runs=()
for model in "${models[@]}"; do
  run=$(python3 -m orchestrator.cli start add-moe-model --model "$model" --device "$device" --branch current \
        --commit never --state-dir "$state" --json 2>>"$out/env.txt" |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["run_id"])')
  [ -n "$run" ] && runs+=("$run") && echo "started $run for $model ($((SECONDS - started)) s)"
done
left=$((deadline - (SECONDS - started)))
pids=()
for i in "${!runs[@]}"; do
  timeout "$left" python3 -m orchestrator.cli advance "${runs[$i]}" --state-dir "$state" > "$out/log_$i.txt" 2>&1 &
  pids+=($!)
done
for i in "${!pids[@]}"; do
  wait "${pids[$i]}"; echo "run ${runs[$i]}: advance exit $? after $((SECONDS - started)) s"
done
for run in "${runs[@]}"; do
  python3 -m orchestrator.cli audit "$run" --state-dir "$state" --schema
  python3 -m orchestrator.cli status "$run" --state-dir "$state" | head -4
done
tar czf "$out/state.tgz" -C "$state" runs anchors
echo "state: $out/state.tgz ($(du -h "$out/state.tgz" | cut -f1)); ${#runs[@]} run(s) in $((SECONDS - started)) s"
