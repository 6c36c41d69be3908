"""``python -m phases.add_moe_model.work.trainer_launch ARGS``: torchtitan's trainer behind the compat layer.

Applies the missing torch pieces (``torch_compat``; one ``@@torch_compat`` line on stderr
when any was applied), then runs ``torchtitan.train`` as ``__main__`` with ARGS unchanged,
so ``torchrun ... -m phases.add_moe_model.work.trainer_launch --module transformers_modeling_backend
--config ...`` is the skill's trainer command on a torch older than torchtitan needs.
"""

from __future__ import annotations

import runpy
import sys

from phases.add_moe_model.work.torch_compat import apply_and_announce


def main(argv: list[str]) -> None:
    apply_and_announce()
    sys.argv = ["torchtitan.train", *argv]
    runpy.run_module("torchtitan.train", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
