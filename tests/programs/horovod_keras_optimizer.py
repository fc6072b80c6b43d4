"""Test program, run through `train` with the mpi distribution on 2 ranks: one step of Keras's
`fit` with ``horovod.tensorflow.keras.DistributedOptimizer`` on different data per rank, the model
and optimizer built with the Keras given. Writes $SM_MODEL_DIR/weights-<rank>.json: the kernel
after the step (4 float32 values).

The step: w = 1 (4 weights, no bias), x = rank + 1 in every feature, y = 0, mean squared error, so
rank r's gradient is 8 (r + 1)^2 per weight: 8 and 32, averaged 20. SGD with learning rate 0.1
then gives 1 - 0.1 * 20 = -1.0 on both ranks; unaveraged, 0.2 on rank 0 and -2.2 on rank 1.

Usage: horovod_keras_optimizer.py --keras {tf.keras|keras}   (keras: Keras 3, `import keras`)
"""
import argparse
import json
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")   # as the image sets it: tf.keras is tf-keras
import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("--keras", choices=["tf.keras", "keras"], required=True)
args = parser.parse_args()
if args.keras == "keras":
    import keras
else:
    keras = tf.keras
hvd.init()
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")])
model.compile(hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), "mse")
x = np.full((8, 4), hvd.rank() + 1.0, "float32")
model.fit(x, np.zeros((8, 1), "float32"), batch_size=8, epochs=1, verbose=0)
with open(os.path.join(os.environ["SM_MODEL_DIR"], f"weights-{hvd.rank()}.json"), "w") as handle:
    json.dump(model.get_weights()[0].ravel().tolist(), handle)
