import os
import signal
import subprocess
import time

from pydantic import BaseModel

from orchestrator.phase_api import Worker
from orchestrator.progress import report


class SquareRequest(BaseModel):
    n: int
    mode: str
    sleep: float
    marker: str


class SquareAnswer(BaseModel):
    square: int
    pid: int


class ReadRequest(BaseModel):
    path: str


class ReadAnswer(BaseModel):
    value: str
    pid: int


def square(request):
    req = SquareRequest.model_validate(request)
    report("squaring")
    if req.mode == "die":
        os.kill(os.getpid(), signal.SIGKILL)
    if req.mode == "slow" and not os.path.exists(req.marker):
        grandchild = subprocess.Popen(["sleep", str(req.sleep + 30)])
        with open(req.marker + ".tmp", "w") as handle:  # the pids, for tests that look for orphans
            handle.write(f"{os.getpid()} {grandchild.pid}\n")
        os.replace(req.marker + ".tmp", req.marker)
        time.sleep(req.sleep)
    return {"square": req.n ** 2, "pid": os.getpid()}


def read_value(request):
    with open(ReadRequest.model_validate(request).path) as handle:
        return {"value": handle.read().strip(), "pid": os.getpid()}


SQUARE = Worker("tests.toyflow.worker_fns:square", SquareRequest, SquareAnswer)
READ_VALUE = Worker("tests.toyflow.worker_fns:read_value", ReadRequest, ReadAnswer)
