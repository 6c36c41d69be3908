#!/usr/bin/env bash
# Packs a device call's state dir for the trip back, in parts the device tool returns (16 MiB a file):
#   bash bench/pack_state.sh STATE_DIR OUT/state_STEP.tgz   # -> OUT/state_STEP.tgz.part-aa, -ab, ...
#   cat FILES_AT/state_STEP.tgz.part-* | tar xzf -          # here, in the repo root
# Leaves out the correctness phase's reference captures (tens of GB at real dims): a call cut in
# correctness leaves one in scratch, and the phase makes it again when it reruns.
set -euo pipefail
state=${1:?STATE_DIR}
packed=${2:?OUT/state_STEP.tgz}
rm -f "$packed".part-*
tar czf - --exclude='*-reference.pt' "$state" | split -b 15M - "$packed.part-"
