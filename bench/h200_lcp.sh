#!/usr/bin/env bash
# One device call of the embedded local-compile-perf run on the H200 (see bench/bench_lcp.py).
#   bash bench/h200_lcp.sh check                 # grads of every region subset vs eager, fp32, small dims (about 1 min)
#   bash bench/h200_lcp.sh start                 # plan .. rank (about 400 s); TOKENS=2048,4096,16384 adds the
#                                                # skill's third count (the bar needs 4096 and 16384; each count
#                                                # costs every later phase a third more device time)
#   bash bench/h200_lcp.sh combine RUN [NAME]    # the five rewrites as one candidate; graph budget and
#                                                # confirmation fit in 540 s, correctness (about 210 s) may not
#   bash bench/h200_lcp.sh finish RUN            # advances a cut phase first, then findings, open_prs=no, audit
#   bash bench/h200_lcp.sh diag                  # glue of each rewrite prefix in .devstate/diag (one process each;
#                                                # DIAG_GPUS picks the GPU, so it can run beside `start` on GPU 0)
# The state directory is .devstate/state (ignore it in .git/info/exclude and carry it between
# calls); missing pure-Python wheels are read from $WHEELS (default state/workspaces/lcp-device/whl).
# Each step leaves the state directory as $OUT/state_<step>.tgz.part-* (bench/pack_state.sh; here:
# `rm -rf .devstate && cat FILES_AT/state_<step>.tgz.part-* | tar xzf -`) and $OUT/log_<step>.txt,
# whose report lists every cited median, and exits with the step's status, so calls chain:
# check && start (combine exits 0 on a rejection too).
set -euo pipefail
step=${1:?check, start, combine RUN [NAME] or finish RUN}
wheels=${WHEELS:-state/workspaces/lcp-device/whl}
ls "$wheels"/liger_kernel-*.whl >/dev/null 2>&1 ||
  echo "note: no liger_kernel wheel in $wheels: the best-known columns will say it is not installed" >&2
if ls "$wheels"/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$wheels"/*.whl
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD PYTHONUNBUFFERED=1
state=.devstate/state
# Device calls may land on fresh machines: the trail's signed heads travel inside the carried
# state dir here (a bench harness; on a workstation they stay in ~/.config/orchestrator).
export ORCHESTRATOR_ANCHOR_DIR=${ORCHESTRATOR_ANCHOR_DIR:-$state/.anchors}
rewrites=${REWRITES:-$(python3 -c 'from bench.tp_ep_stack import STACK; print(",".join(STACK))')}
regions5=mla_qk,swiglu,mlp_swiglu,moe_combine,moe_dispatch,rms_norm,add_rms_norm,router
bench=(python3 bench/bench_lcp.py --state-dir "$state" --out /tmp/benchout)
status=0
case "$step" in
  check)   LCP_SCALE=small python3 bench/diag_region_grads.py --rewrites "$rewrites" --dtype fp32 ;;
  start)   rm -rf "$state"
           "${bench[@]}" --tokens "${TOKENS:-4096,16384}" --per-layer-tokens 4096,16384 --warmup 3 --iters 8 \
             --profile-steps 2 --deadline-s 540 --candidate-s 600 --branches '' ;;
  combine) "${bench[@]}" --resume "${2:?RUN}" --deadline-s 540 --candidate-s 60 \
             --combine "$rewrites" \
             --combine-branch "${3:-combined}" ;;
  finish)  "${bench[@]}" --resume "${2:?RUN}" --branches '' --finish ;;
  diag)    # every folder .devstate/diag/pNN-<rewrite> (main plus the first NN rewrites), in order
           variants=()
           for d in .devstate/diag/p*; do
             r=$regions5; grep -q '"rope_in_place"' "$d/examples/moe_layer/attention.py" && r=$r,rope_in_place
             variants+=(--variant "$(basename "$d" | cut -d- -f1)=$d:regions:$r")
           done
           python3 bench/diag/variant_glue.py --gpus "${DIAG_GPUS:-0}" --tokens 4096,16384 --deadline-s "${DIAG_S:-400}" \
             --out "$OUT/diag.json" "${variants[@]}" ;;
  *)       echo "unknown step $step" >&2; exit 2 ;;
esac 2>&1 | tee "$OUT/log_$step.txt" || status=$?
[ "$status" = 0 ] || echo "step $step failed (exit $status, see the log); saving the state anyway"
if [ -d "$state" ]; then bash bench/pack_state.sh "$state" "$OUT/state_$step.tgz"; fi
exit "$status"
