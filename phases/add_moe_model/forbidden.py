"""Global rule of the add-moe-model skill: TP sharding only through ``_sharding_config``.

Scans the *added* lines of a unified diff (``git diff`` output) for the calls the skill
forbids in integration code: forward hooks that convert to DTensor and
``parallelize_module``. Context and removed lines are ignored, so a pre-existing hook
(the numerics script's gate cast) never trips it. Pure text: no torch, no git.
"""

from __future__ import annotations

import re

FORBIDDEN_CALLS = ("register_forward_pre_hook", "register_forward_hook", "parallelize_module")
_PATTERN = re.compile(r"\b(" + "|".join(FORBIDDEN_CALLS) + r")\b")
_HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,\d+)? @@")


def check_added_lines_for_forbidden_calls(diff_text: str, *, scope: str | None = None) -> list[str]:
    """Return one finding per added line that names a forbidden call.

    Args:
        diff_text: unified diff, e.g. ``git diff <base>`` of the target.
        scope: only files whose path starts with this prefix (e.g. the EXP folder).

    Returns:
        ``"<path>:<line>: adds <call> (shard through _sharding_config instead): <code>"``
        for each offending line; empty when clean.
    """
    findings: list[str] = []
    path, line_no = "", 0
    for raw in diff_text.splitlines():
        if raw.startswith("+++ "):
            path = _strip_prefix(raw[4:].strip())
            continue
        if raw.startswith("--- ") or raw.startswith("diff --git"):
            continue
        hunk = _HUNK.match(raw)
        if hunk:
            line_no = int(hunk.group(1))
            continue
        if raw.startswith("+"):
            match = _PATTERN.search(raw[1:])
            if match and (scope is None or path.startswith(scope)):
                findings.append(f"{path}:{line_no}: adds {match.group(1)} "
                                f"(shard through _sharding_config instead): {raw[1:].strip()}")
            line_no += 1
        elif not raw.startswith("-") and not raw.startswith("\\"):
            line_no += 1
    return findings


def _strip_prefix(path: str) -> str:
    path = path.split("\t", 1)[0]
    return path[2:] if path.startswith(("a/", "b/")) else path
