"""Test program: a Horovod TensorFlow job whose ranks all-reduce a tensor under different names
(each rank its own, in a tf.function: in eager mode Horovod names the all-reduce itself), as ranks
that build their variables in another order do: every rank waits for the others' tensor; without a
stall check it would hang."""
import horovod.tensorflow as hvd
import tensorflow as tf

hvd.init()


@tf.function
def all_reduce(gradient, name):
    return hvd.allreduce(gradient, name=name)


for _ in range(3):
    all_reduce(tf.ones(4), "grad")
print(f"rank {hvd.rank()} all-reduces its own name", flush=True)
all_reduce(tf.ones(4), f"grad_rank{hvd.rank()}")   # the names differ: never completes
print(f"rank {hvd.rank()} done", flush=True)
