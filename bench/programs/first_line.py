"""A4's user script: its first statement records when it started (seconds since the epoch)."""
import time

STARTED_S = time.time()

import os  # noqa: E402  (after the stamp: nothing the script does may count as launch time)

rank = os.environ.get("OMPI_COMM_WORLD_RANK", "0")
with open(os.path.join(os.environ["BENCH_STAMP_DIR"], f"stamp-{rank}"), "w") as handle:
    handle.write(repr(STARTED_S))
