"""Test program: waits to be stopped; on SIGTERM takes ``--save-seconds`` (default 0) as if
saving a checkpoint, then records the signal (per rank) and exits 128 + 15."""
import argparse
import os
import signal
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("--save-seconds", type=float, default=0.0)
args, _ = parser.parse_known_args()
rank = os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("RANK", "single"))
out = os.path.join(os.environ["SM_OUTPUT_DATA_DIR"], f"sigterm-{rank}")


def stop(signum, _frame):
    time.sleep(args.save_seconds)
    with open(out, "w") as handle:
        handle.write(signal.Signals(signum).name)
    sys.exit(128 + signum)


signal.signal(signal.SIGTERM, stop)
open(os.path.join(os.environ["SM_OUTPUT_DATA_DIR"], f"started-{rank}"), "w").close()
time.sleep(120)
