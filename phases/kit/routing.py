"""Routing replay for MoE correctness: the candidate routes every token as the reference did.

Top-k routing is discontinuous: two implementations that differ by one rounding pick
other experts for near-tied tokens, and every grad downstream of those tokens then differs
by O(1) (router-gate grads by ~0.1 relative under any compile). Comparing grads is only
meaningful with the routing held fixed, so the reference capture records each router's
expert ids and the candidate capture replays them, through the model's own router.

A router here is a module with a ``correction_bias`` buffer (a per-expert bias that only
selects experts, DeepSeek-V3 style) whose forward returns ``(weights, expert_ids)``.
Replay swaps the bias for a per-token one that lifts the recorded experts far above the
rest, in their recorded order, so the router's own code selects them and computes their
weights from its own unbiased scores. Keyed by module name, not call count: a router that
runs again in the same step (activation recompute) replays the same ids. Every replayed
call is checked to have chosen exactly the recorded ids.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    import torch
    from torch import nn

LIFT = 1.0e4
"""Added per recorded rank; scores are sigmoids in (0, 1) plus a small bias."""


def find_routers(layers: "nn.Module") -> dict[str, "nn.Module"]:
    """Modules with a ``correction_bias`` buffer, by name."""
    return {name: m for name, m in layers.named_modules() if "correction_bias" in dict(m.named_buffers(recurse=False))}


@contextmanager
def record_routing(layers: "nn.Module") -> Iterator[dict[str, "torch.Tensor"]]:
    """Yield a dict that fills with each router's first expert ids ``[T, k]`` (CPU copies)."""
    recorded: dict[str, "torch.Tensor"] = {}

    def hook(name: str):
        def save(module, args, out):
            recorded.setdefault(name, out[1].detach().to("cpu", copy=True))
        return save

    handles = [m.register_forward_hook(hook(n)) for n, m in find_routers(layers).items()]
    try:
        yield recorded
    finally:
        for h in handles:
            h.remove()


def forced_bias(bias: "torch.Tensor", ids: "torch.Tensor") -> "torch.Tensor":
    """``[T, E]`` bias that ranks ``ids[t]`` first, in order, for every token ``t``."""
    import torch

    top_k = ids.shape[-1]
    lift = LIFT * torch.arange(top_k, 0, -1, device=bias.device, dtype=bias.dtype).expand(ids.shape[0], top_k)
    return bias.expand(ids.shape[0], -1).clone().scatter_add_(1, ids.to(bias.device), lift)


@contextmanager
def replay_routing(layers: "nn.Module", recorded: dict[str, "torch.Tensor"]) -> Iterator[None]:
    """Within the block, each recorded router selects its recorded ids (checked per call).

    Raises:
        ValueError: a recorded router is missing from ``layers``.
        RuntimeError: a router chose other ids than recorded (the replay did not take).
    """
    routers = find_routers(layers)
    missing = sorted(set(recorded) - set(routers))
    if missing:
        raise ValueError(f"routing replay: no router named {missing} in the model (found {sorted(routers)})")
    originals = {name: routers[name].correction_bias for name in recorded}
    handles = []
    for name, ids in recorded.items():
        module, original = routers[name], originals[name]

        def lift(mod, args, original=original, ids=ids):
            mod.correction_bias = forced_bias(original, ids)

        def check(mod, args, out, original=original, ids=ids, name=name):
            mod.correction_bias = original
            chosen = out[1].detach().cpu()
            if not chosen.equal(ids):
                bad = int((chosen != ids).any(-1).sum()) if chosen.shape == ids.shape else ids.shape[0]
                raise RuntimeError(f"routing replay: {name} chose other experts than recorded for {bad} token(s)")

        handles += [module.register_forward_pre_hook(lift), module.register_forward_hook(check)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()
        for name, original in originals.items():
            routers[name].correction_bias = original
