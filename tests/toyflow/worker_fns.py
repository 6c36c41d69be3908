import os
import signal
import time

from orchestrator.progress import report


def square(request):
    report("squaring")
    if request["mode"] == "die":
        os.kill(os.getpid(), signal.SIGKILL)
    if request["mode"] == "slow":
        print("WORKER-SLEEPING", flush=True)
        time.sleep(request["sleep"])
    return {"square": request["n"] ** 2, "pid": os.getpid()}
