"""add-moe-model: the skill as a workflow (table in ``workflow.py``; worker code in ``work/``).

Importing this package builds nothing, so worker subprocesses that import ``work.*`` do not
pay for the workflow table.
"""
