"""Phase 3c step 4: hypothesis patches for what the stage trace finds, written as the known recipes are.

The trace (``work/stage_trace.py``) names the first stage where HF and Titan diverge and what each side's
tensors were; each builder here tests one explanation of such a divergence by a temporary core patch. Like
``gap_recipes``, a builder reads the target's current core file, finds the code by what it does (``ast``, never
a line number) and returns a diff, or ``not_applicable`` naming what it looked for:

- ``build_fp32_router_gate_patch``: the router computes its logits with fp32 inputs and fp32 parameters,
  whatever autocast does (``torch.autocast(dtype=float32)`` around the gate is inactive on CPU, so there the
  gate runs in the run's dtype while HF's router runs in fp32). For a trace whose router logits differ in dtype.
- ``build_experts_run_dtype_patch``: the routed experts compute in the dtype they are given, their bf16 casts
  of inputs and weights removed. For a trace whose expert outputs differ while Titan's grouped matmuls ran
  below the run's dtype.

Pure text and ast: no torch import.
"""

from __future__ import annotations

import ast
from pathlib import Path

from phases.add_moe_model.gap_recipes import MOE, Edit, Missing, RecipePatch, build_recipe, calls_named, replace_node


def build_fp32_router_gate_patch(target: Path) -> RecipePatch:
    desc = ("router logits in fp32: the router's gate runs on fp32 inputs with fp32 parameters "
            "(torch.func.functional_call), whatever autocast does")
    return build_recipe("fp32_router_gate", target, MOE, desc, _edits_fp32_router_gate)


def build_experts_run_dtype_patch(target: Path) -> RecipePatch:
    desc = "routed experts in the run's dtype: their bf16 casts of inputs and weights removed"
    return build_recipe("experts_run_dtype", target, MOE, desc, _edits_experts_run_dtype)


def _classes_calling(tree: ast.Module, name: str) -> list[ast.ClassDef]:
    """Top-level classes with a method that calls ``name`` (or ``<anything>.name``)."""
    return [node for node in tree.body if isinstance(node, ast.ClassDef)
            and any(isinstance(item, ast.FunctionDef) and calls_named(item, name) for item in node.body)]


def _forward(cls: ast.ClassDef) -> ast.FunctionDef:
    found = next((item for item in cls.body if isinstance(item, ast.FunctionDef) and item.name == "forward"), None)
    if found is None:
        raise Missing(f"class {cls.name} has no forward()")
    return found


def _router(tree: ast.Module) -> ast.ClassDef:
    routers = [cls for cls in _classes_calling(tree, "topk")
               if any(isinstance(i, ast.FunctionDef) and i.name == "forward" for i in cls.body)]
    if not routers:
        raise Missing("no class whose methods call topk (the router) has a forward()")
    return routers[0]


def _submodule_calls(cls: ast.ClassDef, fn: ast.FunctionDef) -> list[ast.Call]:
    """``self.<name>(x)`` calls in ``fn`` where ``<name>`` is not a method of ``cls``: its submodules, in order."""
    methods = {item.name for item in cls.body if isinstance(item, ast.FunctionDef)}
    found = [node for node in ast.walk(fn) if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
             and isinstance(node.func.value, ast.Name) and node.func.value.id == "self"
             and node.func.attr not in methods and len(node.args) == 1 and not node.keywords]
    return sorted(found, key=lambda n: (n.lineno, n.col_offset))


def _imports_torch(tree: ast.Module) -> bool:
    return any(isinstance(n, ast.Import) and any(a.name == "torch" and a.asname is None for a in n.names)
               for n in tree.body)


def _edits_fp32_router_gate(tree: ast.Module, source: str) -> list[Edit]:
    router = _router(tree)
    fn = _forward(router)
    gates = _submodule_calls(router, fn)
    if not gates:
        raise Missing(f"{router.name}.forward() calls no submodule on one input (self.<gate>(x)) to compute its "
                      "logits (already computed another way, e.g. by this patch)")
    if not _imports_torch(tree):
        raise Missing("the file does not `import torch`, which the patch calls (torch.func.functional_call)")
    call = gates[0]
    gate, arg = call.func.attr, ast.get_source_segment(source, call.args[0])
    text = (f"torch.func.functional_call(self.{gate}, {{n: p.float() for n, p in self.{gate}.named_parameters()}}, "
            f"(({arg}).float(),))")
    return [replace_node(call, text)]


def _bf16_casts(fn: ast.FunctionDef) -> list[ast.Call]:
    """``<x>.bfloat16()`` and ``<x>.to(torch.bfloat16)`` calls in ``fn``."""
    def is_cast(node: ast.AST) -> bool:
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            return False
        if node.func.attr == "bfloat16" and not node.args and not node.keywords:
            return True
        return (node.func.attr == "to" and len(node.args) == 1 and not node.keywords
                and isinstance(node.args[0], ast.Attribute) and node.args[0].attr == "bfloat16")
    return sorted((n for n in ast.walk(fn) if is_cast(n)), key=lambda n: (n.lineno, n.col_offset))


def _edits_experts_run_dtype(tree: ast.Module, source: str) -> list[Edit]:
    experts = _classes_calling(tree, "_grouped_mm") or _classes_calling(tree, "grouped_mm")
    if not experts:
        raise Missing("no class whose methods call _grouped_mm / grouped_mm (the routed experts)")
    cls = experts[0]
    casts = _bf16_casts(_forward(cls))
    if not casts:
        raise Missing(f"{cls.name}.forward() casts nothing to bf16 (.bfloat16() / .to(torch.bfloat16)): its "
                      "experts already compute in their input's dtype")
    spans = [(c.lineno, c.col_offset, c.end_lineno, c.end_col_offset) for c in casts]
    if any(a[2:] > b[:2] for a, b in zip(spans, spans[1:])):
        raise Missing(f"{cls.name}.forward() nests one bf16 cast inside another")
    return [replace_node(c, ast.get_source_segment(source, c.func.value)) for c in casts]
