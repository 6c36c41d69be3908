#!/bin/bash
# The add-moe-model parallelism matrix for Qwen/Qwen3-30B-A3B (run add-moe-model-20261130-061945-c6f2) on one node of 4 GPUs.
# Submit with `sbatch sbatch.sh` (edit partition/account for your cluster) or run it with bash.
# Each row leaves $RESULTS/<config>.log and $RESULTS/<config>.rc; hand them back with
#   orchestrator resume add-moe-model-20261130-061945-c6f2 --results $RESULTS
#SBATCH --job-name=add-moe-parallelism
#SBATCH --nodes=1
#SBATCH --gpus-per-node=4
#SBATCH --time=01:00:00
set -u
PYTHON=${PYTHON:-/opt/torch/.venv/bin/python3}
TARGET=${TARGET:-/tmp/h200-add-moe-state/workspaces/torchtitan-0.3.0-be1510}
PROJECT=${PROJECT:-/work/main/state/workspaces/gpu-par-dev/src}
ASSETS=${ASSETS:-/tmp/h200-add-moe-state/runs/add-moe-model-20261130-061945-c6f2/artifacts/trainer}
RESULTS=${RESULTS:-$PWD/parallelism-results}
mkdir -p "$RESULTS"
cd "$TARGET" || exit 2
export PYTHONPATH="$TARGET:$PROJECT${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
status=0
echo "=== FSDP-1gpu (world size 1) ==="
"$PYTHON" -m torch.distributed.run --standalone --nproc-per-node=1 -m phases.add_moe_model.work.trainer_launch --module transformers_modeling_backend --config transformers_modeling_backend_debugmodel_moe --hf_model "$ASSETS/hf_config" --hf_assets_path "$ASSETS/tokenizer" --dataloader.dataset_path "$ASSETS/c4_test" --dump_folder "$RESULTS/dump/FSDP-1gpu" --training.steps 2 --training.seq_len 64 > "$RESULTS/FSDP-1gpu.log" 2>&1
rc=$?; echo $rc > "$RESULTS/FSDP-1gpu.rc"; [ $rc = 0 ] || { echo "FAILED FSDP-1gpu (exit $rc)"; status=1; }
echo "=== FSDP (world size 2) ==="
"$PYTHON" -m torch.distributed.run --standalone --nproc-per-node=2 -m phases.add_moe_model.work.trainer_launch --module transformers_modeling_backend --config transformers_modeling_backend_debugmodel_moe --hf_model "$ASSETS/hf_config" --hf_assets_path "$ASSETS/tokenizer" --dataloader.dataset_path "$ASSETS/c4_test" --dump_folder "$RESULTS/dump/FSDP" --training.steps 2 --training.seq_len 64 --parallelism.data_parallel_shard_degree -1 > "$RESULTS/FSDP.log" 2>&1
rc=$?; echo $rc > "$RESULTS/FSDP.rc"; [ $rc = 0 ] || { echo "FAILED FSDP (exit $rc)"; status=1; }
echo "=== FSDP+EP (world size 2) ==="
"$PYTHON" -m torch.distributed.run --standalone --nproc-per-node=2 -m phases.add_moe_model.work.trainer_launch --module transformers_modeling_backend --config transformers_modeling_backend_debugmodel_moe --hf_model "$ASSETS/hf_config" --hf_assets_path "$ASSETS/tokenizer" --dataloader.dataset_path "$ASSETS/c4_test" --dump_folder "$RESULTS/dump/FSDP_EP" --training.steps 2 --training.seq_len 64 --parallelism.data_parallel_shard_degree -1 --parallelism.expert_parallel_degree 2 > "$RESULTS/FSDP_EP.log" 2>&1
rc=$?; echo $rc > "$RESULTS/FSDP_EP.rc"; [ $rc = 0 ] || { echo "FAILED FSDP+EP (exit $rc)"; status=1; }
echo "=== FSDP+TP+EP (world size 4) ==="
"$PYTHON" -m torch.distributed.run --standalone --nproc-per-node=4 -m phases.add_moe_model.work.trainer_launch --module transformers_modeling_backend --config transformers_modeling_backend_debugmodel_moe --hf_model "$ASSETS/hf_config" --hf_assets_path "$ASSETS/tokenizer" --dataloader.dataset_path "$ASSETS/c4_test" --dump_folder "$RESULTS/dump/FSDP_TP_EP" --training.steps 2 --training.seq_len 64 --parallelism.data_parallel_shard_degree -1 --parallelism.tensor_parallel_degree 2 --parallelism.expert_parallel_degree 2 > "$RESULTS/FSDP_TP_EP.log" 2>&1
rc=$?; echo $rc > "$RESULTS/FSDP_TP_EP.rc"; [ $rc = 0 ] || { echo "FAILED FSDP+TP+EP (exit $rc)"; status=1; }
exit $status
