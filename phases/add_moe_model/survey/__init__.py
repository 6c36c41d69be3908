"""``orchestrator survey add-moe-model``: every MoE model type of the installed transformers,
each as its own add-moe-model run (probe, synthetic config, numerics, gap analysis where it
applies, parallelism build check; never a commit), each ending in one outcome.

discover (worker: which model types are MoE, read from transformers' own modeling sources),
outcome (a finished run -> clean / needs_agent / needs_human / fail / unsupported / error),
runner (warm worker, one run per model, resumable rows, progress with an ETA), report
(survey.json, SURVEY.md, survey.html) and cli (the command).
"""
