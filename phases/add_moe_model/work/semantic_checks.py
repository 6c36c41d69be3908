"""Two MoE semantics a key check cannot see, each judged on the target's own modules (worker side).

- Where the router score is applied. Titan's dispatcher scales the expert *outputs* at combine; an HF
  block that scales the expert *input* (Llama 4: ``routed_in * router_scores``) computes f(s x) instead
  of s f(x), and a gated expert makes the two differ. HF's side is read from the block's forward; the
  target's side is measured: its routed experts are called with a known score.
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
    """1 when ``module`` returns a tensor, else the length of the tuple it returns."""
    import torch

    torch.manual_seed(0)
    with torch.no_grad():
        out = module(torch.randn(3, _TOKENS, hidden))
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
