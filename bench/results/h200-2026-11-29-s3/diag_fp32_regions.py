"""Which region zeroes the routed grads in fp32? python diag_fp32_regions.py WORKSPACE [BRANCH] (LCP_SCALE=small)."""
import os, subprocess, sys, tempfile, time
ws = sys.argv[1]; tree = tempfile.mkdtemp(prefix="diag_cand_")
subprocess.run(["git", "-C", ws, "worktree", "add", "-f", "--detach", tree, (sys.argv + ["candidate/combined-replay"])[2]],
               check=True, capture_output=True)
sys.path.insert(0, tree)
import torch
from phases.local_compile_perf.harness import load_harness
from phases.kit.harness import build_tree_workload
from phases.kit.correctness import capture_fwd_bwd
dev = "cuda" if torch.cuda.is_available() else "cpu"
h = load_harness("examples.moe_layer.harness:build_harness")
allr = ["router", "mla_qk", "swiglu", "moe_dispatch", "moe_combine", "mlp_swiglu", "rms_norm", "add_rms_norm"]
allr = [r for r in allr if r in h.spec.all_regions]
print("regions", allr, "torch", torch.__version__, flush=True)
variants = {"eager": []} | {"all": allr} | {f"no-{r}": [x for x in allr if x != r] for r in ["moe_combine", "moe_dispatch", "swiglu", "add_rms_norm"] if r in allr} \
    | {f"only-{r}": [r] for r in ["moe_combine", "moe_dispatch", "add_rms_norm"] if r in allr}
for dtype in (torch.float32,):
    for name, regions in variants.items():
        t0 = time.time()
        torch._dynamo.reset()
        wl = build_tree_workload(h, "regions:" + ",".join(regions) if regions else "eager", tokens=256, device=dev,
                                 dtype=dtype, seed=0)
        cap = capture_fwd_bwd(wl).tensors
        n = lambda k: cap[k].double().norm().item()
        same = cap["grad:1.ffn_norm.weight"].equal(cap["grad:0.ffn_norm.weight"])
        print(f"{str(dtype)[6:]:9s} {name:16s} w2 {n('grad:1.ffn.experts.w2'):.4g} gate {n('grad:1.ffn.router.gate.weight'):.4g} "
              f"ffn_norm1 {n('grad:1.ffn_norm.weight'):.4g} ffn_norm0 {n('grad:0.ffn_norm.weight'):.4g} same01 {same} "
              f"out {n('output'):.5g} {time.time()-t0:.0f}s", flush=True)
