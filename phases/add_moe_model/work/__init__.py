"""Worker-side code of add_moe_model: runs in a subprocess that imports the target checkout.

Modules here import torch / transformers / torchtitan inside their functions, so the engine
can import the package (for names and pydantic models) without pulling torch in.
"""
