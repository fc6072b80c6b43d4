"""Test program: fails the way user scripts do, with an exception naming what went wrong."""
import os
import sys

mode = sys.argv[sys.argv.index("--mode") + 1] if "--mode" in sys.argv else "raise"
rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
if mode == "raise" or (mode == "raise-rank-1" and rank == 1):
    raise ValueError("learning rate must be positive; got -0.1 for $LR")
if mode == "exit-3" or (mode == "exit-3-rank-1" and rank == 1):
    sys.exit(3)
if mode == "abort-rank-1" and rank == 1:   # a C++ library's thread aborting at teardown
    import threading
    import time

    def close_transport():
        time.sleep(0.5)
        os.abort()

    def leave_process_group():
        aborting = threading.Thread(target=close_transport, name="transport")
        aborting.start()
        aborting.join()

    leave_process_group()
if mode in ("raise-rank-1", "exit-3-rank-1", "abort-rank-1"):
    import time
    time.sleep(30)   # rank 0 waits; mpirun must stop it when rank 1 fails
