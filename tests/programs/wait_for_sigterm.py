"""Test program: waits to be stopped; on SIGTERM records it (per rank) and exits 143."""
import os
import signal
import sys
import time

rank = os.environ.get("OMPI_COMM_WORLD_RANK", "single")
out = os.path.join(os.environ["SM_OUTPUT_DATA_DIR"], f"sigterm-{rank}")


def stop(signum, _frame):
    with open(out, "w") as handle:
        handle.write(signal.Signals(signum).name)
    sys.exit(128 + signum)


signal.signal(signal.SIGTERM, stop)
open(os.path.join(os.environ["SM_OUTPUT_DATA_DIR"], f"started-{rank}"), "w").close()
time.sleep(120)
