"""local-compile-perf as a workflow: the skill's steps 0-11 as one table (``workflow.py``).

plan -> baselines -> ideal_times -> profile_diff -> rank -> pick_fix, where the run waits
for the agent's candidate branches (``orchestrator candidate RUN --branch B --label L``).
Each candidate goes graph_budget -> screen_confirm -> correctness -> commit_scope and back
to pick_fix ("rejected" from any of them, "loop" after a commit). Answering
``candidates=done`` leads to findings (asks a human about PRs) and feedback. The engine
measures everything; the agent only writes rewrites.
"""
