"""The base of every event's ``data`` model (``events.py``): frozen, and no field the model does not declare."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class EventBody(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
