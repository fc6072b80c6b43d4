"""Test program: reloads a saved model and scores it on a validation channel read with PIL
(independently of DALI and of the trainer). Prints {"accuracy": ..., "samples": ...}.

Usage: python score_model.py {pytorch|tensorflow} MODEL_DIR CHANNEL_DIR
"""
import json
import os
import sys

import numpy as np
from PIL import Image

framework, model_dir, channel = sys.argv[1:4]
images, labels = [], []
for label in sorted(d for d in os.listdir(channel) if d.isdigit()):   # the digits' class folders
    for name in sorted(n for n in os.listdir(os.path.join(channel, label)) if n.endswith(".png")):
        images.append(np.asarray(Image.open(os.path.join(channel, label, name)), dtype=np.float32) / 255.0)
        labels.append(int(label))
images, labels = np.stack(images), np.array(labels)

if framework == "pytorch":
    import torch

    from dtc_train import torch_model

    model = torch_model.load(os.path.join(model_dir, "model.pth"))
    with torch.no_grad():
        predicted = model(torch.from_numpy(images[:, None, :, :])).argmax(1).numpy()
else:
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tf_keras

    model = tf_keras.models.load_model(os.path.join(model_dir, "1"))
    predicted = model.predict(images[..., None], verbose=0).argmax(1)

print(json.dumps({"accuracy": float((predicted == labels).mean()), "samples": int(len(labels))}))
