"""PR text rules of the skill (pr-template): what a PR body must have and must not have.

``lint_pr_text`` returns every problem at once, each naming the rule: sections in order
(TLDR, Problem, Solution, Results, Test plan), Problem and Solution as 4-6 numbered steps,
numbers of the Results inside a code block, no markdown tables, no ``#N`` references or
GitHub URLs, and no prose paragraphs (a paragraph = 3+ consecutive non-list text lines).
"""

from __future__ import annotations

import re

SECTIONS = ("**TLDR:**", "**Problem**", "**Solution**", "**Results**", "**Test plan**")
_ISSUE_REF = re.compile(r"(?<![\w&/])#\d+\b")
_GITHUB = re.compile(r"https?://(www\.)?github\.com/", re.I)
_TABLE = re.compile(r"^\s*\|.*\|\s*$")
_STEP = re.compile(r"^\s*(\d+)\.\s+\S")


def _outside_code(text: str) -> list[str]:
    lines, fenced = [], False
    for line in text.splitlines():
        if line.strip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def _section(text: str, start: str, end: str) -> str:
    head, _, rest = text.partition(start)
    return rest.partition(end)[0] if _ else ""


def check_steps(text: str, name: str, following: str) -> list[str]:
    body = _section(text, name, following)
    steps = [int(m.group(1)) for line in body.splitlines() if (m := _STEP.match(line))]
    problems = []
    if not 4 <= len(steps) <= 6:
        problems.append(f"{name} has {len(steps)} numbered steps; the skill wants 4-6")
    elif steps != list(range(1, len(steps) + 1)):
        problems.append(f"{name} steps are numbered {steps}, not 1..{len(steps)}")
    return problems


def lint_pr_text(text: str) -> list[str]:
    """Every broken PR-text rule in ``text`` (empty when it passes)."""
    problems = []
    positions = [text.find(s) for s in SECTIONS]
    problems += [f"missing section {s}" for s, p in zip(SECTIONS, positions) if p < 0]
    present = [p for p in positions if p >= 0]
    if present != sorted(present):
        problems.append("sections out of order; expected " + " -> ".join(SECTIONS))
    if not problems:
        problems += check_steps(text, "**Problem**", "**Solution**")
        problems += check_steps(text, "**Solution**", "**Results**")
        results = _section(text, "**Results**", "**Test plan**")
        if "```" not in results:
            problems.append("**Results** numbers must sit in a code block")
    outside = _outside_code(text)
    if any(_TABLE.match(line) for line in outside):
        problems.append("markdown table in a PR body; use a code block")
    if any(_ISSUE_REF.search(line) for line in outside) or _ISSUE_REF.search(text):
        problems.append("#N reference to an issue or PR; don't reference other people's work")
    if _GITHUB.search(text):
        problems.append("GitHub URL in a PR body; don't reference other people's work")
    problems += _paragraphs(outside)
    return problems


def _paragraphs(lines: list[str]) -> list[str]:
    run = 0
    for line in lines + [""]:
        stripped = line.strip()
        prose = bool(stripped) and not re.match(r"^([-*]|\d+\.|\*\*|<|NOTE:|You may ask:|Stack:)", stripped)
        run = run + 1 if prose else 0
        if run >= 3:
            return ["prose paragraph (3+ lines of running text); one fact per line"]
    return []
