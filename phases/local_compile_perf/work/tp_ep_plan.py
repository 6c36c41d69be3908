"""The embedded layer's TP/EP plan on a fake 8-rank mesh (imported only inside the build-check worker).

TP, with DTensor ``parallelize_module`` as torchtitan's DSv3 plan shards MLA and the MLPs: ``wq_b`` and
``wkv_b`` column-wise, ``wo`` row-wise; the dense FFN's and the shared expert's ``w1``/``w3``
column-wise, ``w2`` row-wise. The latent projections (``wq_a``, ``wkv_a``), the norms and the router
gate stay replicated. Each attention module's ``config`` becomes its rank's: ``n_heads // tp``, the
head count its views read, as a Megatron-style layer holds its per-partition heads. Code that takes
the head count from anywhere else (a constant, a weight's global shape, ``out_features``) breaks here
as it would on a TP run.

EP: the routed experts' weights become DTensors sharded on the expert dim (``E / ep`` local experts),
read by the experts' own forward as their local shard (a parametrization), and the experts module is
wrapped in the token exchange of torchtitan's expert parallelism: each row goes by all-to-all to the
rank holding its expert, is regrouped by local expert, and comes back the same way.

The fake process group moves no data: collectives return arbitrary values (a build check, not
numerics), and a rank cannot learn what its peers send. Every peer is therefore modelled as routing
like this rank, so rank ``r`` receives, from each of the ``ep`` peers, this rank's rows for its own
experts: the load of balanced routing, and none at all when routing gives its experts no token.
The fake all-to-all can only copy from its own input; when a rank sends no rows but must receive some
(the combine of a zero-token rank), the received rows are zeros of the right shape, and each such
stand-in is listed.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.nn.utils import parametrize

ATTENTION_PLAN = {"wq_b": "colwise", "wkv_b": "colwise", "wo": "rowwise"}
MLP_PLAN = {"w1": "colwise", "w3": "colwise", "w2": "rowwise"}
EXPERT_WEIGHTS = ("w13", "w2")


def tp_style(kind: str) -> Any:
    return ColwiseParallel() if kind == "colwise" else RowwiseParallel()


def apply_tp(block: nn.Module, mesh: Any, *, tp: int) -> None:
    """Shard one block's attention and MLPs over ``mesh`` (TP ``tp``); the attention reads ``n_heads // tp``."""
    attention = block.attention
    parallelize_module(attention, mesh, {name: tp_style(kind) for name, kind in ATTENTION_PLAN.items()})
    attention.config = dataclasses.replace(attention.config, n_heads=attention.config.n_heads // tp)
    mlp = block.ffn.shared if block.kind == "moe" else block.ffn
    parallelize_module(mlp, mesh, {name: tp_style(kind) for name, kind in MLP_PLAN.items()})


class LocalShard(nn.Module):
    """Parametrization: the experts' forward sees its rank's shard of a DTensor weight."""

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return weight.to_local() if isinstance(weight, DTensor) else weight


class FakeSafeAllToAll(torch.autograd.Function):
    """``all_to_all_single`` of rows, backward the reverse exchange; zeros where the fake group cannot copy."""

    @staticmethod
    def forward(ctx: Any, rows: torch.Tensor, out_splits: list[int], in_splits: list[int],
                exchange: "TokenExchange") -> torch.Tensor:
        ctx.splits, ctx.exchange = (out_splits, in_splits), exchange
        return exchange.all_to_all(rows, out_splits, in_splits, "forward")

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        out_splits, in_splits = ctx.splits
        return ctx.exchange.all_to_all(grad.contiguous(), in_splits, out_splits, "backward"), None, None, None


@dataclasses.dataclass
class TokenExchange:
    """Dispatch and combine around one rank's experts module; keeps what the combine needs."""

    rank: int
    ep: int
    n_local: int
    stand_ins: list[str] = dataclasses.field(default_factory=list)
    rows_sent: int = 0
    rows_received: int = 0
    empty_experts: int = 0
    _pending: list[tuple[torch.Tensor, list[int], list[int]]] = dataclasses.field(default_factory=list)

    def all_to_all(self, rows: torch.Tensor, out_splits: list[int], in_splits: list[int], where: str) -> torch.Tensor:
        out = rows.new_empty((sum(out_splits), *rows.shape[1:]))
        if rows.shape[0] == 0 and out.shape[0] > 0:
            self.stand_ins.append(f"rank {self.rank} {where}: sends 0 rows, receives {out.shape[0]}: zeros")
            return out.zero_()
        dist.all_to_all_single(out, rows.contiguous(), out_splits, in_splits)
        return out

    def dispatch(self, module: nn.Module, inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        """(rows sorted by global expert, counts [E], *per-row tensors such as routing weights) -> this rank's
        rows by local expert, its counts, and the per-row tensors that travel with the rows."""
        rows, counts, per_row = split_expert_inputs(inputs)
        per_rank = counts.view(self.ep, self.n_local)
        in_splits = per_rank.sum(1).tolist()
        # NOTE: the peer model of the module docstring: every peer sends what this rank sends to it.
        received = per_rank[self.rank].repeat(self.ep, 1)  # [ep, n_local]
        out_splits = received.sum(1).tolist()
        x = FakeSafeAllToAll.apply(rows, out_splits, in_splits, self)
        moved = [FakeSafeAllToAll.apply(t.unsqueeze(-1), out_splits, in_splits, self).squeeze(-1) for t in per_row]
        expert_of_row = torch.arange(self.n_local, device=rows.device).repeat(self.ep)
        order = expert_of_row.repeat_interleave(received.flatten()).argsort(stable=True)
        self._pending.append((order, out_splits, in_splits))
        local_counts = received.sum(0)
        self.rows_sent += rows.shape[0]
        self.rows_received += int(local_counts.sum())
        self.empty_experts += int((local_counts == 0).sum())
        return (x[order], local_counts, *(t[order] for t in moved))

    def combine(self, module: nn.Module, inputs: Any, output: torch.Tensor) -> torch.Tensor:
        """Expert outputs of this rank's rows -> the rows this rank sent, in their sent order."""
        order, out_splits, in_splits = self._pending.pop()
        back = torch.empty_like(order)
        back[order] = torch.arange(order.numel(), device=order.device)
        return FakeSafeAllToAll.apply(output[back], in_splits, out_splits, self)


def split_expert_inputs(inputs: tuple[Any, ...]) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """(rows, counts, per-row tensors) of the experts' positional inputs, or a ValueError naming the contract."""
    if len(inputs) >= 2 and all(isinstance(t, torch.Tensor) for t in inputs):
        rows, counts, *per_row = inputs
        if all(t.dim() == 1 and t.shape[0] == rows.shape[0] for t in per_row):
            return rows, counts, per_row
    shapes = [tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__ for t in inputs]
    raise ValueError(f"the EP plan calls the routed experts as experts(rows [R, D], counts [E], *per-row [R] "
                     f"tensors) and moves every per-row tensor with its row; got positional inputs {shapes} "
                     "(keyword arguments do not travel: pass per-row tensors positionally)")


def apply_ep(experts: nn.Module, mesh: Any, *, rank: int, ep: int) -> TokenExchange:
    """Shard the routed experts on their expert dim over ``mesh`` and wrap them in the token exchange."""
    n_global = experts.w13.shape[0]
    for name in EXPERT_WEIGHTS:
        param = getattr(experts, name)
        sharded = distribute_tensor(param.detach(), mesh, [Shard(0)])
        setattr(experts, name, nn.Parameter(sharded, requires_grad=param.requires_grad))
        parametrize.register_parametrization(experts, name, LocalShard(), unsafe=True)
    exchange = TokenExchange(rank=rank, ep=ep, n_local=n_global // ep)
    experts.register_forward_pre_hook(exchange.dispatch)
    experts.register_forward_hook(exchange.combine)
    return exchange


def parallelize_layers(layers: nn.ModuleList, mesh: Any, *, rank: int, tp: int, ep: int) -> list[TokenExchange]:
    """TP on every block (when ``tp > 1``), EP on every MoE block's experts (when ``ep > 1``)."""
    exchanges = []
    for block in layers:
        if tp > 1:
            apply_tp(block, mesh, tp=tp)
        if ep > 1 and block.kind == "moe":
            exchanges.append(apply_ep(block.ffn.experts, mesh, rank=rank, ep=ep))
    return exchanges


def starve_rank(layers: nn.ModuleList, *, rank: int, ep: int) -> int:
    """Bias every router away from ``rank``'s experts so they get no token; returns the routers biased."""
    biased = 0
    for module in layers.modules():
        bias = getattr(module, "correction_bias", None)
        if isinstance(bias, torch.Tensor):
            local = bias.shape[0] // ep
            with torch.no_grad():
                bias[rank * local:(rank + 1) * local] = -1e4
            biased += 1
    return biased


def param_shards(layers: nn.ModuleList) -> list[dict[str, Any]]:
    """Every parameter's global and local shape, its placement and whether the local one is the split."""
    rows = []
    for name, param in layers.named_parameters():
        name = name.replace("parametrizations.", "").replace(".original", "")
        if isinstance(param, DTensor):
            local = tuple(param.to_local().shape)
            placement = ",".join(str(p) for p in param.placements)
            degree = param.device_mesh.size()
            ok = all(loc * (degree if isinstance(p, Shard) and p.dim == d else 1) == glob
                     for d, (loc, glob) in enumerate(zip(local, param.shape))
                     for p in param.placements) and len(local) == param.ndim
        else:
            local, placement, degree, ok = tuple(param.shape), "plain (replicated)", 1, True
        rows.append({"name": name, "global_shape": tuple(param.shape), "local_shape": local,
                     "placement": placement, "degree": degree, "ok": ok})
    return rows
