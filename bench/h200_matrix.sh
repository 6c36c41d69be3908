#!/usr/bin/env bash
# The entry points a user meets first, on CUDA, in few device calls (issue 22):
#   PART=survey bash bench/h200_matrix.sh   survey of every MoE type on the embedded target (--device cuda,
#                                           --jobs JOBS) and, beside it, README command 1 (Qwen3) on CUDA
#   PART=main   bash bench/h200_matrix.sh   the 8 upstream models on the main snapshot, side by side
#                                           (bench/main_tree_models.py --jobs 8)
#   PART=all    bash bench/h200_matrix.sh   both at once (README=0 leaves command 1 out), one device call
# Missing pure-Python wheels come from $WHEELS (default ../whl), the main snapshot tarball from
# $TARGETS (default ../targets): carry a folder holding src/ (this checkout), whl/ and targets/, e.g.
#   D=state/workspaces/matrix-dev; mkdir -p $D/src $D/targets; cp ../shared/targets/*.tar.gz $D/targets/
#   git ls-files -co --exclude-standard | xargs cp --parents -t $D/src
# with whl/ filled as bench/h200_add_moe.sh says, and run `cd $D/src && PART=... bash bench/h200_matrix.sh`.
# Results under $OUT: env.txt, one log per part, and <part>.tgz (runs with trails, artifacts and anchors;
# no workspaces), so `orchestrator audit RUN --state-dir DIR` verifies them on any machine.
set -uo pipefail
out=${OUT:-/tmp/h200-matrix-out}
mkdir -p "$out"
source "$(dirname "$0")/device_env.sh"
part=${PART:-survey}
state=${STATE_DIR:-/tmp/h200-matrix-$part}
export ORCHESTRATOR_ANCHOR_DIR=$state/anchors
git config --global user.email >/dev/null || git config --global user.email bench@example.com
git config --global user.name >/dev/null || git config --global user.name bench
{
  date -u; nvidia-smi -L 2>&1; nproc; python3 --version
  python3 -c 'import torch, transformers
print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count(),
      "transformers", transformers.__version__)' 2>&1 | tail -1
} > "$out/env.txt" 2>&1
cat "$out/env.txt"
started=$SECONDS
survey_part() {  # the survey (JOBS tasks, torchrun rows skipped); README command 1 beside it unless README=0
  local state=$1
  if [ "${README:-1}" = 1 ]; then
    ( timeout "${README_S:-540}" python3 -m orchestrator.cli run add-moe-model --model Qwen/Qwen3-30B-A3B \
        --device cuda --branch new --commit auto --unrun-rows accept --state-dir "$state" > "$out/readme1.log" 2>&1
      echo "README command 1 on cuda: exit $? after $((SECONDS - started)) s" >> "$out/readme1.log" ) &
  fi
  timeout "${SURVEY_S:-540}" python3 -m orchestrator.cli survey add-moe-model --models "${MODELS:-all}" --device cuda \
    --jobs "${JOBS:-12}" --state-dir "$state" --out "$state/survey" > "$out/survey.log" 2>&1
  echo "survey: exit $? after $((SECONDS - started)) s" >> "$out/survey.log"
  python3 bench/bench_add_moe.py --survey-out "$state/survey" --survey-state "$state" >> "$out/survey.log" 2>&1
  wait
}
main_part() {  # the 8 upstream models on the main snapshot, side by side
  local state=$1 tree=/tmp/tt-main
  mkdir -p "$tree" && tar xzf "${TARGETS:-../targets}"/torchtitan-main-b5bcd76c6.tar.gz -C "$tree" --strip-components=1
  (cd "$tree" && git init -q -b main && git add -A && git commit -qm "torchtitan main b5bcd76c6 (snapshot)")
  timeout "${MAIN_S:-540}" python3 bench/main_tree_models.py run --tree "$tree" --state "$state" --device cuda \
    --jobs 8 > "$out/main.log" 2>&1
  echo "main models: exit $? after $((SECONDS - started)) s" >> "$out/main.log"
  python3 bench/main_tree_models.py table --tree "$tree" --state "$state" > "$out/main_table.md" 2>&1
}
case "$part" in
  survey) survey_part "$state" ;;
  main) main_part "$state" ;;
  all) survey_part "$state/survey-state" & main_part "$state/main-state"; wait ;;
esac
tail -n 5 "$out"/*.log 2>/dev/null
# trails, signed heads, public key and the survey's reports (no workspaces or clones; the private key stays)
tar czf "$out/$part.tgz" -C "$state" --exclude='workspaces' --exclude='tt-*' --exclude='.pristine*' --exclude='trail.ed25519' .
echo "$part: $(du -h "$out/$part.tgz" | cut -f1) in $((SECONDS - started)) s"
