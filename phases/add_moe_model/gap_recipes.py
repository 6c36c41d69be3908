"""Phase 3c: the skill's three known-difference patches, written against today's core code.

Each ``build_<name>_patch(target)`` reads the target's *current* core file, finds the
code it changes by structure (``ast``: class -> method -> call shape), never by line
number, and returns a git-apply-able unified diff (paths relative to the target root).
When the structure is not there it returns ``not_applicable`` with a reason that
names what it looked for, so an agent can write the patch by hand instead.

Builders read the file as it is, so they compose: patch 2 built after patch 1 was
applied diffs against the patched file (the skill's rows are cumulative). Patches
are temporary diagnostics: the phase applies, measures and reverts them.
Pure text and ast: no torch import.
"""

from __future__ import annotations

import ast
import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

DISPATCHER = "torchtitan/models/common/token_dispatcher.py"
MOE = "torchtitan/models/common/moe.py"


@dataclass(frozen=True, kw_only=True, slots=True)
class RecipePatch:
    """One diagnostic patch (or why it cannot be built).

    Attributes:
        name: "fp32_combine" | "token_order_sum" | "sorted_topk", or a hypothesis of ``gap_hypotheses``.
        path: core file it edits, relative to the target root.
        status: "applicable" or "not_applicable".
        diff: unified diff for ``git apply`` ("" when not applicable).
        reason: why not applicable, naming the structure looked for.
        description: what the patch changes and what the skill predicts.
    """

    name: str
    path: str
    status: Literal["applicable", "not_applicable"]
    diff: str = ""
    reason: str = ""
    description: str = ""


@dataclass(frozen=True, kw_only=True, slots=True)
class Edit:
    start: tuple[int, int]  # (line 1-based, col 0-based)
    end: tuple[int, int]
    text: str


class Missing(Exception):
    """Structure the recipe needs is absent; the message says what was looked for."""


def build_fp32_combine_patch(target: Path) -> RecipePatch:
    """Keep ``LocalTokenDispatcher.combine`` in fp32 through the scatter-add; cast at the end."""
    desc = ("combine(): scores applied in fp32 and kept fp32 through the scatter-add into an fp32 "
            "buffer, cast to the input dtype on return (skill: removes bf16 accumulation error)")
    return build_recipe("fp32_combine", target, DISPATCHER, desc, _edits_fp32_combine)


def build_token_order_sum_patch(target: Path) -> RecipePatch:
    """Sum the top-k contributions in token order (unsort + reshape(T, K, D).sum(1)) like HF."""
    desc = ("dispatch keeps the stable argsort permutation in the metadata; combine unsorts the "
            "expert outputs and sums reshape(T, K, D) over K instead of the expert-sorted "
            "scatter-add (skill: no effect for top_k=1)")
    return build_recipe("token_order_sum", target, DISPATCHER, desc, _edits_token_order_sum)


def build_sorted_topk_patch(target: Path) -> RecipePatch:
    """``torch.topk(..., sorted=True)`` in ``TokenChoiceTopKRouter.forward`` (HF's default order)."""
    desc = ("router topk sorted=True so the route-norm sum adds scores in HF's order "
            "(skill: no effect for top_k=1)")
    return build_recipe("sorted_topk", target, MOE, desc, _edits_sorted_topk)


def build_all_patches(target: Path) -> list[RecipePatch]:
    """The three recipes in the skill's order, each built against the current files."""
    return [build_fp32_combine_patch(target), build_token_order_sum_patch(target),
            build_sorted_topk_patch(target)]


def build_recipe(name: str, target: Path, rel: str, description: str, edits_fn) -> RecipePatch:
    path = Path(target) / rel
    if not path.is_file():
        return RecipePatch(name=name, path=rel, status="not_applicable", description=description,
                           reason=f"{rel} not found under {target}")
    source = path.read_text()
    try:
        edits = edits_fn(ast.parse(source), source)
    except Missing as missing:
        return RecipePatch(name=name, path=rel, status="not_applicable", description=description,
                           reason=f"{rel}: {missing}")
    new_source = _apply_edits(source, edits)
    return RecipePatch(name=name, path=rel, status="applicable", description=description,
                       diff=render_diff(source, new_source, rel=rel))


def render_diff(old: str, new: str, *, rel: str) -> str:
    lines = difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                 fromfile=f"a/{rel}", tofile=f"b/{rel}")
    return "".join(lines)


def _apply_edits(source: str, edits: list[Edit]) -> str:
    lines = source.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))

    def pos(lc: tuple[int, int]) -> int:
        # NOTE: ast columns are UTF-8 byte offsets; the core files are ASCII where we edit.
        return offsets[lc[0] - 1] + lc[1]

    for edit in sorted(edits, key=lambda e: pos(e.start), reverse=True):
        source = source[: pos(edit.start)] + edit.text + source[pos(edit.end):]
    return source


def _span(node: ast.AST) -> tuple[tuple[int, int], tuple[int, int]]:
    return (node.lineno, node.col_offset), (node.end_lineno, node.end_col_offset)


def replace_node(node: ast.AST, text: str) -> Edit:
    start, end = _span(node)
    return Edit(start=start, end=end, text=text)


def find_method(tree: ast.Module, cls: str, method: str) -> ast.FunctionDef:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == method:
                    return item
            raise Missing(f"class {cls} has no method {method}()")
    raise Missing(f"no top-level class {cls}")


def calls_named(fn: ast.AST, name: str) -> list[ast.Call]:
    """Calls to ``name`` or ``<anything>.name`` inside ``fn``, in source order."""
    found = []
    for node in ast.walk(fn):
        if isinstance(node, ast.Call):
            f = node.func
            if (isinstance(f, ast.Name) and f.id == name) or (isinstance(f, ast.Attribute) and f.attr == name):
                found.append(node)
    return sorted(found, key=lambda n: (n.lineno, n.col_offset))


def _scatter_assign(fn: ast.FunctionDef) -> tuple[ast.Assign, ast.Call]:
    for stmt in ast.walk(fn):
        if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call):
            f = stmt.value.func
            if getattr(f, "id", getattr(f, "attr", "")) in ("deterministic_scatter_add", "scatter_add"):
                return stmt, stmt.value
    raise Missing("LocalTokenDispatcher.combine() has no `<out> = deterministic_scatter_add(out, index, src)` "
                   "(or .scatter_add) assignment")


def _x_param(fn: ast.FunctionDef) -> str:
    names = [a.arg for a in fn.args.args]
    if len(names) < 4:
        raise Missing("combine(self, routed_output, metadata, x) signature not found")
    return names[3]


def _edits_fp32_combine(tree: ast.Module, source: str) -> list[Edit]:
    fn = find_method(tree, "LocalTokenDispatcher", "combine")
    _, scatter = _scatter_assign(fn)
    dest = scatter.args[0] if scatter.args else None
    zeros = [c for c in calls_named(fn, "zeros_like") if not any(k.arg == "dtype" for k in c.keywords)]
    if not isinstance(dest, ast.Name) or not zeros:
        raise Missing("combine() has no `torch.zeros_like(x)` buffer without dtype feeding the scatter-add "
                       "(already fp32, or restructured)")
    cast_back = [c for c in calls_named(fn, "to") if isinstance(c.func, ast.Attribute)
                 and isinstance(c.func.value, ast.BinOp)
                 and isinstance(c.func.value.op, ast.Mult) and c.args
                 and isinstance(c.args[0], ast.Attribute) and c.args[0].attr == "dtype"]
    if not cast_back:
        raise Missing("combine() has no `(expert_out.to(float32) * scores).to(<tensor>.dtype)` cast back")
    returns = [n for n in ast.walk(fn) if isinstance(n, ast.Return) and n.value is not None]
    if len(returns) != 1:
        raise Missing(f"combine() must have exactly one `return <value>` (found {len(returns)})")
    zero_call = zeros[0]
    zero_text = ast.get_source_segment(source, zero_call)
    ret_text = ast.get_source_segment(source, returns[0].value)
    return [
        replace_node(zero_call, zero_text[:-1] + ", dtype=torch.float32)"),
        _drop_cast_suffix(cast_back[0], source),
        replace_node(returns[0].value, f"{ret_text}.to({_x_param(fn)}.dtype)"),
    ]


def _drop_cast_suffix(call: ast.Call, source: str) -> Edit:
    """Delete the trailing ``.to(<x>.dtype)`` of ``(<product>).to(<x>.dtype)``, keep the rest."""
    suffix = f".to({ast.get_source_segment(source, call.args[0])})"
    line = source.splitlines()[call.end_lineno - 1]
    start_col = call.end_col_offset - len(suffix)
    if line[start_col:call.end_col_offset] != suffix:
        raise Missing(f"cast back `{suffix}` is not written on one line at the end of the product")
    return Edit(start=(call.end_lineno, start_col), end=(call.end_lineno, call.end_col_offset), text="")


def _insert_line_after(node: ast.AST, text: str) -> Edit:
    """Insert ``text`` (one full line, with newline) after the last line of ``node``."""
    return Edit(start=(node.end_lineno + 1, 0), end=(node.end_lineno + 1, 0), text=text)


def _edits_token_order_sum(tree: ast.Module, source: str) -> list[Edit]:
    meta_cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "LocalDispatchMetadata"), None)
    if meta_cls is None:
        raise Missing("no LocalDispatchMetadata dataclass to carry the dispatch permutation")
    fields = [n for n in meta_cls.body if isinstance(n, ast.AnnAssign)]
    if not fields or any(getattr(f.target, "id", "") == "permutation_N" for f in fields):
        raise Missing("LocalDispatchMetadata has no annotated fields, or already carries permutation_N")
    dispatch = find_method(tree, "LocalTokenDispatcher", "dispatch")
    meta_calls = calls_named(dispatch, "LocalDispatchMetadata")
    if len(meta_calls) != 1 or not meta_calls[0].keywords:
        raise Missing("dispatch() does not build exactly one LocalDispatchMetadata(...) with keywords")
    ids_param = [a.arg for a in dispatch.args.args][3:4]
    if not ids_param:
        raise Missing("dispatch(self, x, topk_scores, topk_expert_ids, ...) signature not found")
    combine = find_method(tree, "LocalTokenDispatcher", "combine")
    assign, scatter = _scatter_assign(combine)
    if len(scatter.args) < 3:
        raise Missing("scatter-add call in combine() does not take (out, index, src) positionally")
    dest = ast.get_source_segment(source, scatter.args[0])
    src = ast.get_source_segment(source, scatter.args[2])
    out = ast.get_source_segment(source, assign.targets[0])
    indent = " " * assign.col_offset
    last_kw = meta_calls[0].keywords[-1]
    field_indent = " " * fields[-1].col_offset
    new_combine = (
        f"# token order, as HF: unsort the expert outputs and sum the K contributions per token\n"
        f"{indent}unsorted_src = torch.empty_like({src})\n"
        f"{indent}unsorted_src[metadata.permutation_N] = {src}\n"
        f"{indent}{out} = {dest} + unsorted_src.reshape({dest}.shape[0], self.top_k, -1).sum(dim=1).to({dest}.dtype)"
    )
    perm = f"permutation_N=torch.argsort({ids_param[0]}.view(-1), stable=True)"
    kw_line = source.splitlines()[last_kw.value.end_lineno - 1]
    if kw_line[last_kw.value.end_col_offset:].strip() == ",":
        kw_edit = _insert_line_after(last_kw.value, f"{' ' * last_kw.col_offset}{perm},\n")
    else:
        end = (last_kw.value.end_lineno, last_kw.value.end_col_offset)
        kw_edit = Edit(start=end, end=end, text=f", {perm}")
    return [
        _insert_line_after(fields[-1], f"{field_indent}permutation_N: torch.Tensor | None = None  # noqa: N815\n"),
        kw_edit,
        replace_node(assign, new_combine),
    ]


def _edits_sorted_topk(tree: ast.Module, source: str) -> list[Edit]:
    fn = find_method(tree, "TokenChoiceTopKRouter", "forward")
    edits = []
    for call in calls_named(fn, "topk"):
        for kw in call.keywords:
            if kw.arg == "sorted" and isinstance(kw.value, ast.Constant) and kw.value.value is False:
                edits.append(replace_node(kw.value, "True"))
    if not edits:
        raise Missing("TokenChoiceTopKRouter.forward() has no torch.topk(..., sorted=False) call "
                       "(already sorted, or routing moved elsewhere)")
    return edits
