import os
import signal
import subprocess
import time

from orchestrator.progress import report


def square(request):
    report("squaring")
    if request["mode"] == "die":
        os.kill(os.getpid(), signal.SIGKILL)
    if request["mode"] == "slow" and not os.path.exists(request["marker"]):
        grandchild = subprocess.Popen(["sleep", str(request["sleep"] + 30)])
        with open(request["marker"] + ".tmp", "w") as handle:  # the pids, for tests that look for orphans
            handle.write(f"{os.getpid()} {grandchild.pid}\n")
        os.replace(request["marker"] + ".tmp", request["marker"])
        time.sleep(request["sleep"])
    return {"square": request["n"] ** 2, "pid": os.getpid()}


def read_value(request):
    with open(request["path"]) as handle:
        return {"value": handle.read().strip(), "pid": os.getpid()}
