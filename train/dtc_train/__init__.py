"""Built-in trainers: TensorFlow and PyTorch with Horovod, reading data through NVIDIA DALI."""
