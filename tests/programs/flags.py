"""Test program: the flag declarations docs/entrypoint.md (Flags) shows, and what they parse to.

FLAGS_MODE=store-true declares --fp16-allreduce with action="store_true" instead (how scripts
written for a shell declare it), FLAGS_MODE=no-model-dir leaves --model_dir out: the failures
SageMaker's conventions then cause.
"""
import argparse
import json
import os
import sys


# --- docs/entrypoint.md, Flags: start
def flag(value: str) -> bool:
    """'True', 'true', '1', 'yes' and '' (a flag given with no value) are on; anything else is off."""
    return value.strip().lower() in ("true", "1", "yes", "")


parser = argparse.ArgumentParser()
parser.add_argument("--fp16-allreduce", type=flag, nargs="?", const=True, default=False)
parser.add_argument("--use-adasum", type=flag, nargs="?", const=True, default=False)
parser.add_argument("--model_dir", default=None)   # SageMaker's TensorFlow estimator passes it
# --- docs/entrypoint.md, Flags: end

mode = os.environ.get("FLAGS_MODE", "")
if mode:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fp16-allreduce", **({"action": "store_true"} if mode == "store-true" else
                                               {"type": flag, "nargs": "?", "const": True, "default": False}))
    parser.add_argument("--use-adasum", type=flag, nargs="?", const=True, default=False)
    if mode == "store-true":
        parser.add_argument("--model_dir", default=None)
args = parser.parse_args()
with open(os.path.join(os.environ["SM_OUTPUT_DATA_DIR"], "flags.json"), "w") as handle:
    json.dump({**vars(args), "argv": sys.argv[1:]}, handle)
