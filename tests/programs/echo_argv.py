"""Test program: records the argv and the SM_* view it was started with, per rank."""
import json
import os
import sys

rank = os.environ.get("OMPI_COMM_WORLD_RANK", "single")
record = {"argv": sys.argv[1:], "sm_user_args": json.loads(os.environ["SM_USER_ARGS"]),
          "hps": json.loads(os.environ["SM_HPS"]), "cwd": os.getcwd(),
          "world_size": os.environ.get("OMPI_COMM_WORLD_SIZE"), "pythonpath": os.environ.get("PYTHONPATH")}
out = os.path.join(os.environ["SM_OUTPUT_DATA_DIR"], f"argv-{rank}.json")
with open(out, "w") as handle:
    json.dump(record, handle)
