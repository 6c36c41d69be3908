"""JSON Schemas of the trail, generated from the pydantic models into state/schemas/.

``python -m orchestrator.schemas [DIR]`` rewrites them; a test fails when the committed
files differ from what the models generate, so the documented format cannot drift.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from orchestrator.trail.events import DATA_TYPES, Event
from orchestrator.trail.snapshot_schema import RunSnapshot

DEFAULT_DIR = Path(__file__).resolve().parent.parent / "state" / "schemas"


def generate() -> dict[str, dict]:
    """File name -> schema for the event envelope, each event's data, and run.json."""
    schemas = {"event.json": Event.model_json_schema(), "run.json": RunSnapshot.model_json_schema()}
    for name, model in sorted(DATA_TYPES.items()):
        schemas[f"events/{name}.json"] = model.model_json_schema()
    return schemas


def render(schema: dict) -> str:
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def write(directory: Path = DEFAULT_DIR) -> list[Path]:
    written = []
    for name, schema in generate().items():
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render(schema))
        written.append(path)
    return written


if __name__ == "__main__":
    for path in write(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_DIR):
        print(path)
