"""A MultiWorkerMirroredStrategy-style script whose chief (worker 0) writes the model
``--save-seconds`` after the other workers have ended, as TensorFlow's tutorials save on the
chief only. Reads ``TF_CONFIG`` as such a script does; imports no TensorFlow (the dispatcher's
handling of the hosts' ends is what it exercises)."""

import argparse
import json
import os
import time

parser = argparse.ArgumentParser()
parser.add_argument("--save-seconds", type=float, default=15)
args = parser.parse_args()
task = json.loads(os.environ["TF_CONFIG"])["task"]
time.sleep(3)   # training, which every worker ends together (its steps' collectives)
print(f"worker {task['index']}: last step done", flush=True)
if task["index"] == 0:
    time.sleep(args.save_seconds)   # the chief writes a large model
    with open(os.path.join(os.environ["SM_MODEL_DIR"], "model.txt"), "w", encoding="utf-8") as model:
        model.write("written by the chief\n")
    print("worker 0: model written", flush=True)
