"""Micro-repro: routed grads through the gather-combine region (SumRows) in fp32 vs bf16, variants."""
import torch

dev = "cuda" if torch.cuda.is_available() else "cpu"
T, K, D, E = 256, 4, 64, 8


def gather_sum(rows, slot, k, copy):
    picked = rows[slot].view(-1, k, rows.shape[-1])
    acc = picked[:, 0].to(torch.float32, copy=True) if copy else picked[:, 0].float()
    for j in range(1, k):
        acc = acc + picked[:, j].float()
    return acc.to(rows.dtype)


def make(copy=False, index_select=False, clone_out=False):
    class SumRows(torch.autograd.Function):
        @staticmethod
        def forward(ctx, rows, token_index, slot, k):
            ctx.save_for_backward(token_index)
            out = gather_sum(rows, slot, k, copy)
            return out.clone() if clone_out else out

        @staticmethod
        def backward(ctx, g):
            (ti,) = ctx.saved_tensors
            return (g.index_select(0, ti) if index_select else g[ti]), None, None, None

    def combine(rows, token_index, slot, shared):
        return SumRows.apply(rows, token_index, slot, K) + shared
    return combine


def run(fn, dtype, loop, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(E, D, D, generator=g).to(dev, dtype).requires_grad_()
    x = torch.randn(T * K, D, generator=g).to(dev, dtype)
    experts = torch.randint(0, E, (T * K,), generator=g).to(dev)
    order = experts.argsort(stable=True)
    token_index = order // K
    slot = torch.empty_like(order).scatter_(0, order, torch.arange(order.numel(), device=dev))
    shared = torch.randn(T, D, generator=g).to(dev, dtype).requires_grad_()
    counts = torch.bincount(experts, minlength=E)
    xs = x[order]
    if loop:  # the harness's per-expert loop (fp32/fp64 on CUDA)
        rows = torch.cat([c @ w[e].T for e, c in enumerate(xs.split(counts.tolist()))])
    else:
        rows = xs @ w[0].T
    out = fn(rows, token_index, slot, shared)
    out.float().square().mean().backward()
    return w.grad.double().norm().item(), shared.grad.double().norm().item()


def make_outside(compile_inner):
    """The Function applied in eager; its forward/backward bodies are the compiled pieces."""
    fwd = lambda rows, slot, shared: gather_sum(rows, slot, K, False) + shared
    bwd = lambda g, ti: g[ti]
    if compile_inner:
        fwd, bwd = torch.compile(fwd, fullgraph=True), torch.compile(bwd, fullgraph=True)

    class SumRowsAdd(torch.autograd.Function):
        @staticmethod
        def forward(ctx, rows, token_index, slot, shared):
            ctx.save_for_backward(token_index)
            return fwd(rows, slot, shared)

        @staticmethod
        def backward(ctx, g):
            (ti,) = ctx.saved_tensors
            return bwd(g, ti), None, None, g

    return lambda rows, token_index, slot, shared: SumRowsAdd.apply(rows, token_index, slot, shared)


variants = {"as shipped": {}, "copy": {"copy": True}, "index_select": {"index_select": True},
            "clone_out": {"clone_out": True}}
for loop in (True, False):
    for dtype in (torch.float32, torch.bfloat16):
        tag = f"{str(dtype)[6:]:9s} {'loop' if loop else 'matmul':6s}"
        eager = run(make(), dtype, loop)
        for name, kw in variants.items():
            torch._dynamo.reset()
            comp = run(torch.compile(make(**kw), fullgraph=True), dtype, loop)
            ok = abs(comp[0] - eager[0]) <= 1e-2 * eager[0]
            print(f"{tag} {name:16s} eager w.grad {eager[0]:.5g} compiled {comp[0]:.5g} {'OK' if ok else 'WRONG'}",
                  flush=True)
        torch._dynamo.reset()
        comp = run(make_outside(True), dtype, loop)
        ok = abs(comp[0] - eager[0]) <= 1e-2 * eager[0]
        print(f"{tag} {'fn outside':16s} eager w.grad {eager[0]:.5g} compiled {comp[0]:.5g} {'OK' if ok else 'WRONG'}",
              flush=True)
