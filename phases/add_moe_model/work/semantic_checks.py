"""Three MoE semantics a key check cannot see, each judged on the target's own modules (worker side).

- Where the router score is applied. Titan's dispatcher scales the expert *outputs* at combine; an HF
  block that scales the expert *input* (Llama 4: ``routed_in * router_scores``) computes f(s x) instead
  of s f(x), and a gated expert makes the two differ. HF's side is read from the block's forward; the
  target's side is measured: its routed experts are called with a known score.
- How tokens are routed. HF's block is run on a tiny batch and the experts and weights it hands its
  experts are compared with the target's own router given HF's gate weights. A difference that one
  of Titan's router rules explains (score function, renormalisation, route scale) is the experiment
  folder's to fix; one that none explains (phimoe's sparsemixer) is a router Titan does not have.
- What the MoE returns. A decoder layer that unpacks ``(out, router_logits)`` from its MoE needs a
  tuple. HF's side is what a tiny block returns; the target's side is what the module its own swap
  (``build_and_swap_native_moe``) puts in the layer returns.

A finding stands only while the target still does the other thing, so a fix of any shape clears it.
Both run on a tiny materialized twin of the model (random values) on CPU, in fp32.
"""

from __future__ import annotations

import inspect
import re
from types import SimpleNamespace
from typing import Any, Literal

from phases.add_moe_model.compat import EXP, CompatIssue
from phases.add_moe_model.work.expert_scale import factor_after_experts

MOE_REPLACEMENT = f"{EXP}/moe_replacement.py"
TOKEN_DISPATCHER = "torchtitan/models/common/token_dispatcher.py"
_SCORE = 0.25
_TOKENS = 4

Placement = Literal["input", "output"]


def hf_scaled_input_line(block: Any) -> str | None:
    """The line of the block's forward that scales the experts' input by a score, if there is one."""
    try:
        source = inspect.getsource(type(block).forward)
    except (OSError, TypeError):
        return None
    call = re.search(r"self\.experts\(\s*(\w+)", source)
    if call is None:
        return None
    name = re.escape(call.group(1))
    line = re.search(rf"^\s*{name}\s*(=\s*{name}\s*\*|\*=)[^\n]*scor[^\n]*$", source, re.MULTILINE)
    return line.group(0).strip() if line else None


def titan_score_placement(titan_moe: Any) -> Placement | None:
    """Measure where the target's routed experts apply the score: "output" when out(s) = s * out(1),
    "input" when out(s) = out(1) at s * x; None when neither holds (or the weights are all zero)."""
    import torch

    from phases.add_moe_model.work.layout import detect_routed_layout

    routed = titan_moe.routed_experts
    layout = detect_routed_layout(routed)
    experts, top_k = int(routed.token_dispatcher.num_experts), int(routed.token_dispatcher.top_k)
    hidden = next(p for p in routed.parameters()).shape[-1]
    torch.manual_seed(0)
    x = torch.randn(1, _TOKENS, hidden)
    ids = (torch.arange(_TOKENS * top_k).reshape(1, _TOKENS, top_k) % experts).long()
    counts = torch.bincount(ids.flatten(), minlength=experts)

    def call(inputs: Any, score: float) -> Any:
        scores = torch.full((1, _TOKENS, top_k), score)
        with torch.no_grad():
            out = routed(layout.tokens(inputs), layout.per_token(scores), layout.per_token(ids), counts)
        return out.reshape(_TOKENS, hidden)

    scored, plain, scaled_input = call(x, _SCORE), call(x, 1.0), call(_SCORE * x, 1.0)
    if not plain.abs().sum() > 0:
        return None
    at_output = torch.allclose(scored, _SCORE * plain, rtol=1e-4, atol=1e-6)
    at_input = torch.allclose(scored, scaled_input, rtol=1e-4, atol=1e-6)
    if at_output != at_input:
        return "output" if at_output else "input"
    return None


def check_score_placement(hf_block: Any, titan_moe: Any) -> list[CompatIssue]:
    """HF scales the expert input by the score while the target's Titan MoE scales the outputs."""
    line = hf_scaled_input_line(hf_block)
    if line is None or titan_score_placement(titan_moe) == "input":
        return []
    return [
        CompatIssue(
            code="router_score_before_experts",
            message=(
                f"{type(hf_block).__name__} scales the experts' input by the router score (`{line}`), so each "
                "expert computes f(s*x); the target's Titan MoE applies the score to the expert outputs at "
                f"combine, s*f(x) (measured on its routed experts with s={_SCORE})"
            ),
            fix_location=(
                f"{MOE_REPLACEMENT} (_build_moe_config: a token dispatcher that scales the routed input and not "
                f"the output; a workaround in the experiment folder; with EP the all-to-all dispatcher of "
                f"{TOKEN_DISPATCHER} needs the same, outside it)"
            ),
            severity="fixable",
        )
    ]


def output_arity(module: Any, hidden: int) -> int:
    """1 when ``module`` returns a tensor, else the length of the tuple it returns; called as the decoder layer
    calls it, on (1, T, H) (torchtitan main's swapped MoE takes HF's batch of one and flattens it)."""
    import torch

    torch.manual_seed(0)
    with torch.no_grad():
        out = module(torch.randn(1, _TOKENS, hidden))
    return len(out) if isinstance(out, tuple) else 1


def swap_like_the_target(moe_module: Any, layer: Any, moe_config: Any) -> Any:
    """Run the target's own ``build_and_swap_native_moe`` on one layer; return what it put there."""
    layer._native_moe_config = moe_config
    before = {name: child for name, child in layer.named_children()}
    moe_module.build_and_swap_native_moe(SimpleNamespace(layers={"0": layer}),
                                         SimpleNamespace(ep_enabled=False, tp_enabled=False))
    swapped = [child for name, child in layer.named_children() if before.get(name) is not child]
    return swapped[0] if swapped else None


def check_output_contract(hf_block: Any, swapped: Any, *, hidden: int) -> list[CompatIssue]:
    """The module the target swaps in must return what HF's block returns (a tensor, or a tuple the layer unpacks)."""
    hf, titan = output_arity(hf_block, hidden), output_arity(swapped, hidden)
    if hf == titan:
        return []
    said = {1: "a tensor"}
    return [
        CompatIssue(
            code="moe_output_contract",
            message=(
                f"HF's {type(hf_block).__name__} returns {said.get(hf, f'a tuple of {hf}')} and its decoder layer "
                f"unpacks that, but the module the target's build_and_swap_native_moe puts in the layer "
                f"({type(swapped).__name__}) returns {said.get(titan, f'a tuple of {titan}')}"
            ),
            fix_location=(
                f"{MOE_REPLACEMENT} (the swapped MoE's forward: return what the HF layer unpacks; a workaround in "
                "the experiment folder for the HF layer's contract)"
            ),
            severity="fixable",
        )
    ]


def hf_routing(hf_block: Any, x: Any, *, top_k: int) -> tuple[Any, Any, Any] | None:
    """(expert ids, weights, router input): the ids and weights, each (T, K), that HF's block routes tokens ``x``
    (T, H) with: what it hands its experts as ``experts(hidden, top_k_index, top_k_weights)``, else what its
    router returns as dense (T, E) weights with ``top_k`` nonzero per token (Llama 4); and what its router was
    given, (T, H) (a norm before the router is the block's). None when it shows no routing."""
    import torch

    seen: dict[str, Any] = {}

    def capture(_module: Any, args: tuple, kwargs: dict) -> None:
        if len(args) >= 3 and not torch.is_floating_point(args[1]):
            seen["ids"], seen["weights"] = args[1], args[2]

    def given(_module: Any, args: tuple, kwargs: dict) -> None:
        found = args[0] if args else kwargs.get("hidden_states")
        if torch.is_tensor(found) and found.shape[-1] == x.shape[-1] and found.numel() == x.numel():
            seen.setdefault("router_in", found.reshape(x.shape))

    def dense(_module: Any, _args: tuple, out: Any) -> None:
        for tensor in out if isinstance(out, tuple) else (out,):
            if torch.is_tensor(tensor) and tensor.dim() == 2 and tensor.shape[0] == x.shape[0] \
                    and torch.is_floating_point(tensor) and bool(((tensor != 0).sum(-1) == top_k).all()):
                seen.setdefault("dense", tensor)

    router = getattr(hf_block, "gate", None) or getattr(hf_block, "router", None)
    experts = getattr(hf_block, "experts", None)
    handles = [experts.register_forward_pre_hook(capture, with_kwargs=True)] if experts is not None else []
    if router is not None:
        handles += [router.register_forward_hook(dense), router.register_forward_pre_hook(given, with_kwargs=True)]
    try:
        with torch.no_grad():
            hf_block(x.unsqueeze(0))
    finally:
        for handle in handles:
            handle.remove()
    given_x = seen.get("router_in", x)
    if "ids" in seen:
        return seen["ids"].reshape(x.shape[0], -1), seen["weights"].reshape(x.shape[0], -1), given_x
    if "dense" in seen:
        weights, ids = seen["dense"].topk(top_k, dim=-1)
        return ids, weights, given_x
    return None


def titan_router(swapped: Any) -> Any | None:
    return next((m for m in swapped.modules() if hasattr(m, "score_func") and hasattr(m, "gate")), None)


def plain_gate(hf_block: Any, experts: int, hidden: int) -> tuple[Any, Any] | None:
    """HF's router as one linear map (E, H) and at most a correction bias of E values used to choose experts
    (flattened: ERNIE keeps it (1, E); HY-V3 keeps it on the block). The linear is the router itself or its one
    submodule of that shape; any other state of the router (an MLP, scales) is a rule the comparison cannot give
    the target. State of the block after the router (a norm, an output bias) does not route: the comparison
    gives the target's router what HF's router received."""
    router = getattr(hf_block, "gate", None) or getattr(hf_block, "router", None)
    if router is None:
        return None
    shaped = [m for m in router.modules()
              if tuple(getattr(getattr(m, "weight", None), "shape", ())) == (experts, hidden)]
    if len(shaped) != 1:
        return None
    linear = shaped[0]
    gate = {id(linear.weight), id(getattr(linear, "bias", None))}
    own = [(n, t) for n, t in [*router.named_parameters(), *router.named_buffers()] if id(t) not in gate]
    outside = [(n, t) for n, t in [*hf_block.named_parameters(recurse=False), *hf_block.named_buffers(recurse=False)]
               if t.numel() == experts]
    biases = [t for n, t in own + outside if "bias" in n.rsplit(".", 1)[-1] and t.numel() == experts]
    if len(own) != len([t for n, t in own if "bias" in n.rsplit(".", 1)[-1] and t.numel() == experts]) \
            or len(biases) > 1:
        return None
    return linear, (biases[0].reshape(-1) if biases else None)


def same_routing(ids_a: Any, w_a: Any, ids_b: Any, w_b: Any) -> Any:
    """Per token: the same experts with the same weights (order free)."""
    import torch

    order_a, order_b = ids_a.argsort(dim=-1), ids_b.argsort(dim=-1)
    same_ids = (ids_a.gather(-1, order_a) == ids_b.gather(-1, order_b)).all(dim=-1)
    close = torch.isclose(w_a.gather(-1, order_a).float(), w_b.gather(-1, order_b).float(), rtol=1e-4, atol=1e-6)
    return same_ids & close.all(dim=-1)


def rule_that_matches(logits: Any, bias: Any, ids: Any, weights: Any, top_k: int,
                      groups: tuple[int, int] | None = None) -> str | None:
    """The Titan router rule (score function, renormalisation, route scale) that gives HF's routing, if any;
    ``groups`` = (expert groups, groups kept): the group-limited choice both sides make before the top-k."""
    import torch

    for score_func in ("softmax", "sigmoid"):
        scores = logits.softmax(-1) if score_func == "softmax" else logits.sigmoid()
        choice = scores if bias is None else scores + bias
        chosen = limit_to_groups(choice, groups).topk(top_k, dim=-1).indices
        for norm in (False, True):
            picked = scores.gather(-1, chosen)
            picked = picked / picked.sum(-1, keepdim=True) if norm else picked
            scale = float(weights.sum() / picked.sum())
            if bool(same_routing(chosen, picked * scale, ids, weights.to(torch.float32)).all()):
                return f"score_func={score_func}, route_norm={norm}, route_scale={scale:.4g}"
    return None


def limit_to_groups(choice: Any, groups: tuple[int, int] | None) -> Any:
    """Keep the experts of the ``kept`` groups with the highest top-2 sums (DeepSeek-V3's rule); -inf elsewhere."""
    if groups is None:
        return choice
    count, kept = groups
    grouped = choice.unflatten(-1, (count, choice.shape[-1] // count))
    best = grouped.topk(2, dim=-1).values.sum(-1).topk(kept, dim=-1).indices
    mask = grouped.new_ones(grouped.shape[:-1], dtype=bool).scatter(-1, best, False)
    return grouped.masked_fill(mask.unsqueeze(-1), float("-inf")).flatten(-2)


def router_groups(router: Any) -> tuple[int, int] | None:
    count = getattr(router, "num_expert_groups", None)
    return None if count is None else (int(count), int(getattr(router, "num_limited_groups", None) or count))


def check_routing(hf_block: Any, swapped: Any, *, hidden: int) -> list[CompatIssue]:
    """HF's routing (experts per token, and weights times the factor HF's block applies after its experts) against
    the target's own router given HF's gate weights; a finding saying why when the comparison cannot be made."""
    import torch

    router = titan_router(swapped)
    if router is None:
        return [routing_not_run(f"the module the target swaps in ({type(swapped).__name__}) has no router with a "
                                "gate and a score function to give HF's gate weights")]
    experts = int(getattr(router, "num_experts", 0) or 0)
    found = plain_gate(hf_block, experts, hidden) if experts else None
    if found is None:
        return [routing_not_run(f"HF's {type(hf_block).__name__} does not route with one linear gate ({experts}, "
                                f"{hidden}) and at most a correction bias, which the comparison gives the target")]
    gate, bias = found
    if (getattr(gate, "bias", None) is None) != (getattr(router.gate, "bias", None) is None) \
            or tuple(getattr(router.gate, "weight", torch.empty(0)).shape) != tuple(gate.weight.shape):
        return [routing_not_run(f"HF's gate (weight {tuple(gate.weight.shape)}, bias "
                                f"{getattr(gate, 'bias', None) is not None}) and the target's router gate do not "
                                "take the same weights")]
    torch.manual_seed(1)
    x = torch.randn(16 * _TOKENS, hidden)
    seen = hf_routing(hf_block, x, top_k=int(getattr(router, "top_k", 0) or 0))
    if seen is None:
        return [routing_not_run(f"HF's {type(hf_block).__name__} neither calls its experts as experts(hidden, "
                                "top_k_index, top_k_weights) nor has its router return per-token weights with top-k "
                                "nonzero, where the comparison reads its routing")]
    hf_ids, hf_weights, given = seen
    with torch.no_grad():
        router.gate.weight.copy_(gate.weight)
        if getattr(gate, "bias", None) is not None:
            router.gate.bias.copy_(gate.bias)
        given = given.to(gate.weight.dtype)
        weights, ids = router(given.unsqueeze(0), None if bias is None else bias.detach().float())[:2]
        logits = torch.nn.functional.linear(given, gate.weight, getattr(gate, "bias", None))
    factor = factor_after_experts(getattr(hf_block, "experts", None), lambda: hf_block(x.unsqueeze(0)))
    seen = hf_ids, hf_weights * (1.0 if factor is None else factor)
    agree = same_routing(ids.reshape(seen[0].shape), weights.reshape(seen[1].shape), *seen)
    if bool(agree.all()):
        return []
    rule = rule_that_matches(logits, None if bias is None else bias.float(), seen[0], seen[1],
                             top_k=seen[0].shape[-1], groups=router_groups(router))
    return [routing_issue(hf_block, router, rule, differ=f"{int((~agree).sum())} of {agree.numel()} tokens")]


def routing_not_run(why: str) -> CompatIssue:
    """The routing comparison could not be made: a person's to waive (the comparison is this workflow's)."""
    return CompatIssue(
        code="routing_check_not_run", severity="blocker",
        message=f"the routing rule check did not run: {why}; whether the target routes tokens as HF does is unchecked",
        fix_location="phases/add_moe_model/work/semantic_checks.py (check_routing), this workflow's comparison; or a "
                     "person waives it: orchestrator resume RUN --waive routing_check_not_run --reason TEXT")


def routing_issue(hf_block: Any, router: Any, rule: str | None, *, differ: str) -> CompatIssue:
    target = f"score_func={router.score_func}, route_norm={router.route_norm}, route_scale={router.route_scale}"
    if rule is not None:
        return CompatIssue(
            code="router_rule_mismatch", severity="fixable",
            message=(f"with HF's gate weights, the target's router ({target}) routes {differ} of a tiny twin "
                     f"differently from HF's {type(hf_block).__name__}, which matches {rule}"),
            fix_location=f"{MOE_REPLACEMENT} (_probe_hf_moe_block / _build_moe_config: the router's score function, "
                         "renormalisation and route scale)")
    return CompatIssue(
        code="router_rule_unsupported", severity="core",
        message=(f"with HF's gate weights, no rule of Titan's TokenChoiceTopKRouter (softmax or sigmoid, top-k, "
                 f"with or without renormalisation, any route scale) gives HF's {type(hf_block).__name__} routing: "
                 f"the target's router ({target}) differs on {differ} (e.g. phimoe's sparsemixer)"),
        fix_location="torchtitan/models/common/moe.py (TokenChoiceTopKRouter): a routing rule Titan does not have, "
                     "outside the experiment folder (a person decides; a router written in the experiment folder "
                     "would be a workaround)")
