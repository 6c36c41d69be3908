import os
import signal
import time

from orchestrator.progress import report


def square(request):
    report("squaring")
    if request["mode"] == "die":
        os.kill(os.getpid(), signal.SIGKILL)
    if request["mode"] == "slow" and not os.path.exists(request["marker"]):
        open(request["marker"], "w").close()
        time.sleep(request["sleep"])
    return {"square": request["n"] ** 2, "pid": os.getpid()}


def read_value(request):
    with open(request["path"]) as handle:
        return {"value": handle.read().strip(), "pid": os.getpid()}
