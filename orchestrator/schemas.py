"""JSON Schemas of the trail, generated from the pydantic models into state/schemas/.

``python -m orchestrator.schemas [DIR]`` rewrites them; a test fails when the committed
files differ from what the models generate, so the documented format cannot drift. The
built-in workflows' typed record kinds (``Workflow.records``) are there too, under
``records/<workflow>/<kind>.json``, and ``check_records`` holds a trail's records to them
(``audit --schema``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from typing import Any

from orchestrator.trail.events import DATA_TYPES, Event
from orchestrator.trail.snapshot_schema import RunSnapshot

DEFAULT_DIR = Path(__file__).resolve().parent.parent / "state" / "schemas"


def generate() -> dict[str, dict]:
    """File name -> schema for the event envelope, each event's data, and run.json."""
    schemas = {"event.json": Event.model_json_schema(), "run.json": RunSnapshot.model_json_schema()}
    for name, model in sorted(DATA_TYPES.items()):
        schemas[f"events/{name}.json"] = model.model_json_schema()
    from orchestrator.workflow import BUILTIN_WORKFLOWS, load_workflow

    for workflow_name in sorted(BUILTIN_WORKFLOWS):
        for kind, model in sorted(load_workflow(workflow_name).records.items()):
            schemas[f"records/{workflow_name}/{kind}.json"] = model.model_json_schema()
    return schemas


def check_records(events: list[dict[str, Any]], workflow: Any) -> list[Any]:
    """Findings (check "schema") for each ``record_added`` whose record is not its kind's model in ``workflow``."""
    from pydantic import ValidationError

    from orchestrator.trail.findings import Finding

    models, findings = dict(getattr(workflow, "records", None) or {}), []
    for event in events:
        data = event.get("data") or {}
        model = models.get(data.get("kind")) if event.get("type") == "record_added" else None
        if model is None:
            continue
        try:
            model.model_validate(data.get("record"))
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "record"
            message = f"{data['kind']} record is not a {model.__name__}: {where}: {first['msg']}"
            findings.append(Finding(seq=event.get("seq"), check="schema", message=message))
    return findings


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
