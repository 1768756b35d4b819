"""An LSTM classifier on MNIST read as sequences: each image is 28 steps of 28 pixels, one
row a step (the classic sequential-MNIST task), through two stacked LSTM layers of 128
units; the last step's output is classified. Seed 001's optional task: "pick any RNN
network, train it in parallel, measure Horovod's training time and throughput"."""
from lab.models import ModelSpec, register

SPEC = register(ModelSpec(
    name="lstm",
    about="an LSTM reading MNIST row by row (sequential MNIST)",
    synthetic=(1, 28, 10),           # 28 steps of 28 features, 10 classes
    most_stages=3,                   # net.layers: lstm1, lstm2, fc hold parameters
    loss="nll",
    synthetic_samples=60000,
    # Plain SGD at the CNN's rate barely moves an LSTM in a few epochs (digits, 3 epochs,
    # one process: 14.7% at lr 0.01, 39.7% at 1.0; Adam at 0.01: 87.0%, measured here).
    optimizer="adam",
))
