"""The torch compatibility layer: each piece on a torch that lacks it (the symbol hidden in a fresh process).

Each test runs a fresh interpreter, hides one symbol the way an older torch lacks it, applies
the layer, and uses what it provided. A torch that has a symbol keeps its own object.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import ROOT

PRELUDE = """
import json, torch
import torch.distributed as dist
import torch.distributed.fsdp as fsdp
from torch.nn.attention import flex_attention
from phases.add_moe_model.work import torch_compat
"""


def in_fresh_python(body: str) -> dict:
    script = PRELUDE + textwrap.dedent(body)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_data_parallel_mesh_dims_is_provided_when_missing() -> None:
    out = in_fresh_python("""
        del fsdp.DataParallelMeshDims
        applied, again = torch_compat.apply(), torch_compat.apply()
        dims = fsdp.DataParallelMeshDims(shard="dp_shard")
        print(json.dumps({"applied": applied, "again": again, "shard": dims.shard, "replicate": dims.replicate}))
    """)
    assert "torch.distributed.fsdp.DataParallelMeshDims" in out["applied"] and out["again"] == []
    assert (out["shard"], out["replicate"]) == ("dp_shard", None)


def test_set_timeout_forwards_to_the_process_groups_timeout() -> None:
    out = in_fresh_python("""
        import datetime
        from torch.distributed import distributed_c10d
        dist.__dict__.pop("set_timeout", None)
        calls = []
        original = distributed_c10d._set_pg_timeout
        distributed_c10d._set_pg_timeout = lambda timeout, group=None: (calls.append(timeout.seconds),
                                                                       original(timeout, group))
        applied = torch_compat.apply()
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        dist.set_timeout(datetime.timedelta(seconds=123))
        dist.destroy_process_group()
        print(json.dumps({"applied": applied, "calls": calls}))
    """)
    assert "torch.distributed.set_timeout" in out["applied"] and out["calls"] == [123]


def test_non_strict_tracing_query_answers_false() -> None:
    out = in_fresh_python("""
        del torch.compiler._is_non_strict_tracing
        applied = torch_compat.apply()
        print(json.dumps({"applied": applied, "value": torch.compiler._is_non_strict_tracing()}))
    """)
    assert "torch.compiler._is_non_strict_tracing" in out["applied"] and out["value"] is False


def test_create_block_mask_takes_separate_full_blocks_and_refuses_false() -> None:
    out = in_fresh_python("""
        def older(mask_mod, B, H, Q_LEN, KV_LEN, device=None, BLOCK_SIZE=128, _compile=False):
            return ["older", Q_LEN, KV_LEN]
        flex_attention.create_block_mask = older
        applied = torch_compat.apply()
        kept = flex_attention.create_block_mask(None, 1, 1, 64, 64, separate_full_blocks=True)
        try:
            flex_attention.create_block_mask(None, 1, 1, 64, 64, separate_full_blocks=False)
            refused = ""
        except NotImplementedError as exc:
            refused = str(exc)
        print(json.dumps({"applied": applied, "kept": kept, "refused": refused}))
    """)
    assert "create_block_mask(separate_full_blocks=)" in out["applied"]
    assert out["kept"] == ["older", 64, 64] and "needs torch >= 2.13" in out["refused"]


def test_a_torch_that_has_a_symbol_keeps_its_own_object() -> None:
    out = in_fresh_python("""
        names = list(torch_compat.PIECES)
        missing = [n for n in names if not torch_compat.PIECES[n][0]()]
        before = [id(fsdp.__dict__.get("DataParallelMeshDims")), id(flex_attention.create_block_mask),
                  id(getattr(torch.compiler, "_is_non_strict_tracing", None))]
        applied = torch_compat.apply()
        after = [id(fsdp.__dict__.get("DataParallelMeshDims")), id(flex_attention.create_block_mask),
                 id(getattr(torch.compiler, "_is_non_strict_tracing", None))]
        present = [n for n in names if n not in missing]
        print(json.dumps({"missing": missing, "applied": applied, "present": present,
                          "kept": [b == a for b, a in zip(before, after)], "checked": names[:1] + names[2:]}))
    """)
    assert out["applied"] == out["missing"]
    for name, kept in zip(out["checked"], out["kept"]):
        assert kept == (name in out["present"]), name


def test_announcement_is_one_parsable_line_with_the_torch_version() -> None:
    from phases.add_moe_model.work.torch_compat import MARKER, parse_announcements

    line = MARKER + json.dumps({"applied": ["torch.distributed.set_timeout"], "torch": "2.11.0+cu130"})
    assert parse_announcements(f"noise\n{line}\n{MARKER}not json\n") == [
        {"applied": ["torch.distributed.set_timeout"], "torch": "2.11.0+cu130"}]


def test_fsdp_capability_is_probed_not_read_from_the_version() -> None:
    out = in_fresh_python("""
        real = torch_compat.fsdp_capability()
        def fully_shard(module, *, mesh=None, reshard_after_forward=None):
            return module
        fsdp.fully_shard = fully_shard
        older = torch_compat.fsdp_capability()
        print(json.dumps({"real": real, "older": older}))
    """)
    assert out["older"] == {"torch": out["real"]["torch"], "accepts_dp_mesh_dims": False, "ok": False,
                            "error": "fully_shard() has no dp_mesh_dims parameter"}
    real = out["real"]
    assert real["ok"] is (real["error"] is None)
    if not real["ok"] and real["accepts_dp_mesh_dims"]:
        assert "DTensor" in real["error"]


@pytest.mark.slow
def test_torchtitan_imports_with_every_piece_hidden_once_the_layer_is_applied() -> None:
    hide = """
        del fsdp.DataParallelMeshDims
        dist.__dict__.pop("set_timeout", None)
        del torch.compiler._is_non_strict_tracing
        def older(mask_mod, B, H, Q_LEN, KV_LEN, device=None, BLOCK_SIZE=128, _compile=False):
            return None
        flex_attention.create_block_mask = older
    """
    probe = """
        try:
            import torchtitan.experiments.transformers_modeling_backend.parallelize
            import torchtitan.models.common.decoder
            error = ""
        except ImportError as exc:
            error = str(exc)
    """
    hide, probe = textwrap.dedent(hide), textwrap.dedent(probe)
    without = in_fresh_python(hide + probe + 'print(json.dumps({"error": error}))')
    assert "DataParallelMeshDims" in without["error"]
    with_layer = in_fresh_python(hide + "applied = torch_compat.apply()\n" + probe
                                 + 'print(json.dumps({"error": error, "applied": applied}))')
    assert with_layer == {"error": "", "applied": list(__import__(
        "phases.add_moe_model.work.torch_compat", fromlist=["PIECES"]).PIECES)}


def test_a_call_forked_from_the_surveys_warm_worker_runs_with_what_a_fresh_worker_applies() -> None:
    # The survey's warm worker once imported torchtitan before the layer, so on torch 2.11 every
    # row was "cannot import name 'DataParallelMeshDims'". Same pieces, same announcement line.
    from orchestrator.worker import run_worker
    from phases.add_moe_model.survey.runner import warm_worker
    from phases.add_moe_model.work.torch_compat import parse_announcements

    func = "phases.add_moe_model.work.torch_compat:describe"
    fresh = run_worker(func, {}, target=ROOT)
    said = []
    with warm_worker(ROOT, say=said.append) as warm:
        assert warm.ready_s is not None, said
        forked = run_worker(func, {}, target=ROOT, runner=warm.runner)
    assert fresh.answer is not None and forked.answer is not None, forked.log[-2000:]
    assert forked.answer["missing"] == [] and forked.answer == fresh.answer
    assert parse_announcements(forked.log.decode()) == parse_announcements(fresh.log.decode())
    assert "not imported: none" in said[0], said
