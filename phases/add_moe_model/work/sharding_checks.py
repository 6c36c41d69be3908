"""Attention and dense-path sharding needs, checked with the target's own helpers (worker side).

``_set_layer_sharding_configs`` and ``_assert_all_states_sharded`` run on the HF decoder
layers built on meta, exactly as the target would run them at parallelize time (TP off),
so an unhandled projection or an unconfigured module shows up here, in Phase 1, not on a GPU.
One more gap is checked: a module that has a config but whose own parameters are not in its
``state_shardings`` (e.g. attention sinks), which the target's backstop does not see and its
``model.parallelize`` then refuses, TP or not.
"""

from __future__ import annotations

from typing import Any

from phases.add_moe_model.compat import EXP, CompatIssue

HF_SHARDING = f"{EXP}/hf_sharding.py"
# Modules the target deletes after the swap for layer-level MoE (see build_and_swap_native_moe).
_LAYER_LEVEL_DROPPED = ("router", "experts", "mlp", "pre_feedforward_layernorm_2", "post_feedforward_layernorm_1",
                        "post_feedforward_layernorm_2")


# Class-name marks of sequence mixers that are not softmax attention (Mamba, gated delta nets, ...).
_LINEAR_MIXER_MARKS = ("mamba", "delta", "linearattention", "linear_attn", "ssm", "lightning", "rwkv")


def resolve_attention_kind(attn: Any) -> str:
    """gqa | mla | mla+dsa | linear | custom | none, from one sequence mixer's convolution, projections or class.

    A mixer with a short convolution (Mamba, gated delta nets, Kimi delta attention) is linear even where it
    has q_proj/k_proj/v_proj: softmax attention has no convolution over the sequence. Latent projections say
    MLA before the class name is read, since a model's name may hold a mark (KimiLinearAttention is its MLA).
    """
    if attn is None:
        return "none"
    if short_conv(attn) is not None:
        return "linear"
    present = {n for n, m in attn.named_children() if m is not None}
    if present & {"kv_a_proj_with_mqa", "q_a_proj"}:
        return "mla+dsa" if "indexer" in present else "mla"
    if any(mark in type(attn).__name__.lower() for mark in _LINEAR_MIXER_MARKS):
        return "linear"
    if {"q_proj", "k_proj", "v_proj"} <= present:
        return "gqa"
    return "custom"


def short_conv(attn: Any) -> tuple[str, Any] | None:
    """(name, module) of a mixer's own Conv1d child, if it has one."""
    return next(((n, m) for n, m in attn.named_children() if type(m).__name__ == "Conv1d"), None)


def sequence_mixer(layer: Any) -> tuple[str, Any] | None:
    """(attribute, module) of a decoder layer's attention or other sequence mixer; None when it has none."""
    attn = getattr(layer, "self_attn", None)
    if attn is not None:
        return "self_attn", attn
    for name, child in layer.named_children():
        lowered, kind = name.lower(), type(child).__name__.lower()
        if "norm" in lowered or child is None:
            continue
        mixes = "attention" in kind or any(mark in kind for mark in _LINEAR_MIXER_MARKS)
        if "attn" in lowered or "attention" in lowered or mixes:
            return name, child
    return None


def check_layer_sharding(sharding: Any, layer: Any, *, index: int, moe_attr: str | None) -> list[CompatIssue]:
    """Run the target's layer sharding setup and completeness backstop on one HF layer."""
    layer.moe_enabled = moe_attr is not None
    try:
        sharding._set_layer_sharding_configs(layer, enable_sp=False)
    except (ValueError, AttributeError, NotImplementedError) as exc:
        hint = none_children_hint(getattr(layer, "self_attn", None), layer)
        return [_issue("attention_projection_unhandled", f"layer {index}: {type(exc).__name__}: {exc}{hint}")]
    skip = _moe_modules(layer, moe_attr)
    try:
        sharding._assert_all_states_sharded(layer, path=f"layers.{index}", skip=skip)
    except ValueError as exc:
        hint = unsharded_hint(layer, str(exc), index=index)
        return [_issue("module_without_sharding_config", f"layer {index}: {exc}{hint}")]
    return check_uncovered_state(layer, index=index, skip=skip)


def unsharded_hint(layer: Any, message: str, *, index: int) -> str:
    """What each module the backstop names is, and for a linear-attention mixer the config that is safe, and why.

    The target's own advice ("shard it, or use _replicate_config") read literally would column-shard a linear
    mixer's q/k/v like softmax attention's, in front of a convolution over their channels together.
    """
    from phases.add_moe_model.work.build_check import parse_unsharded

    named = [p.removeprefix(f"layers.{index}.") for p in parse_unsharded(message)]
    parts = [f"{name}: {module_text(layer.get_submodule(name))}" for name in named if _has_submodule(layer, name)]
    said = f" What they are: {'; '.join(parts)}." if parts else ""
    found = sequence_mixer(layer)
    if found is None or resolve_attention_kind(found[1]) != "linear":
        return said
    return said + linear_mixer_advice(*found)


def linear_mixer_advice(attr: str, mixer: Any) -> str:
    """The safe config of a linear-attention mixer (replicated whole), with the measured reason."""
    conv = short_conv(mixer)
    qkv = [n for n in ("q_proj", "k_proj", "v_proj") if getattr(mixer, n, None) is not None]
    configured = [n for n in qkv if getattr(getattr(mixer, n), "_sharding_config", None) is not None]
    fused = sum(getattr(getattr(mixer, n), "out_features", 0) for n in qkv)
    reason = ""
    if conv is not None and qkv and getattr(conv[1], "in_channels", None) == fused:
        reason = (f" Its {conv[0]} convolves the {fused} channels of {'/'.join(qkv)} together (its in_channels is "
                  "their outputs' sum), so a column shard of each projection hands a rank channels that are not the "
                  f"block a dim-0 shard of {conv[0]} holds.")
    took = (f" The target's _set_layer_sharding_configs configured {', '.join(configured)} by name as softmax "
            "attention's (column-sharded by head): do not keep that for this mixer." if configured else "")
    return (f" {attr} ({type(mixer).__name__}) is linear attention (a recurrence over the sequence), not softmax "
            f"attention.{reason}{took} Safe config: the whole mixer replicated (_replicate_config on each of its "
            "modules, its input gathered to Replicate at its boundary, its output returned to the sequence-parallel "
            "layout): correct under TP at the cost of computing it on every rank.")


def module_text(module: Any) -> str:
    """"Linear 2560->32", "Conv1d 12288 channels, kernel 4, groups 12288", or the class and its own shapes."""
    name = type(module).__name__
    if hasattr(module, "in_features") and hasattr(module, "out_features"):
        return f"{name} {module.in_features}->{module.out_features}"
    if hasattr(module, "in_channels") and hasattr(module, "kernel_size"):
        return f"{name} {module.in_channels} channels, kernel {module.kernel_size[0]}, groups {module.groups}"
    own = [f"{n} {tuple(t.shape)}" for n, t in [*module.named_parameters(recurse=False),
                                               *module.named_buffers(recurse=False)]]
    return f"{name} ({', '.join(own)})" if own else name


def _has_submodule(layer: Any, name: str) -> bool:
    try:
        layer.get_submodule(name)
    except AttributeError:
        return False
    return True


def check_uncovered_state(layer: Any, *, index: int, skip: tuple[Any, ...]) -> list[CompatIssue]:
    """Own parameters of a configured module that its state_shardings leave out.

    ``Module._distribute_states`` raises for such a state whatever the parallelism: the name is looked up
    before any mesh is resolved, so an FSDP-only run (TP off) fails at parallelize as well.
    """
    skip_ids = {id(s) for m in skip for s in m.modules()}
    uncovered = []
    for name, mod in layer.named_modules():
        config = getattr(mod, "_sharding_config", None)
        if config is None or id(mod) in skip_ids:
            continue
        declared = set(getattr(config, "state_shardings", None) or {})
        own = [n for n, _ in list(mod.named_parameters(recurse=False)) + list(mod.named_buffers(recurse=False))]
        uncovered += [f"layers.{index}.{name}.{n}".replace("..", ".") for n in own if n not in declared]
    if not uncovered:
        return []
    return [_issue("state_missing_from_sharding_config",
                   f"configured modules leave their own state undeclared: {uncovered[:6]}; the target's "
                   "model.parallelize raises for each (its _distribute_states wants a placement in state_shardings "
                   "for every own parameter and buffer of a configured module), with TP or without (FSDP/EP only)")]


def check_dsa_under_tp(attn: Any) -> list[str]:
    """DSA indexers run only without TP in the target: a note, not an issue (documented limit)."""
    if attn is None or not hasattr(attn, "indexer"):
        return []
    return ["DSA indexer present: the target fails loud under TP by design (FSDP/EP only)"]


def none_children_hint(attn: Any, layer: Any) -> str:
    if attn is None:
        found = sequence_mixer(layer)
        if found:
            return (f" (the layer's attention is at {found[0]} ({type(found[1]).__name__}), not self_attn, which "
                    "the target's sharding reads)")
        return " (the layer has no self_attn: attention-free layers, e.g. Mamba or linear attention)"
    # NOTE: HF registers absent projections as None children, and hasattr() is True for them.
    nones = sorted(n for n, m in {**vars(attn), **attn._modules}.items()
                   if m is None and n.endswith(("_proj", "_layernorm", "_norm")))
    return f" ({type(attn).__name__} has None children {nones}: hasattr() is True for them)" if nones else ""


def _moe_modules(layer: Any, moe_attr: str | None) -> tuple[Any, ...]:
    if moe_attr is None:
        return ()
    if moe_attr == "<layer>":
        return tuple(getattr(layer, n) for n in _LAYER_LEVEL_DROPPED if hasattr(layer, n))
    return (getattr(layer, moe_attr),)


def _issue(code: str, message: str) -> CompatIssue:
    return CompatIssue(code=code, message=message, fix_location=f"{HF_SHARDING} (_set_layer_sharding_configs)",
                       severity="fixable")
