"""The sequential-MNIST LSTM's torch code (inside a rank)."""
from __future__ import annotations

import functools

import torch
import torch.nn as nn

HIDDEN = 128


class Rows(nn.Module):
    """(N, C, H, W) images -> (N, H, C*W) sequences: one row of pixels a step."""

    def forward(self, x):
        return x.permute(0, 2, 1, 3).flatten(2)


@functools.cache
def cpu_has_bf16_lstm() -> bool:
    """Whether this CPU runs oneDNN's bf16 LSTM: CPU autocast sends nn.LSTM to oneDNN
    (mkldnn_rnn_layer is on autocast's CPU lower-precision list: PyTorch's AMP docs,
    "CPU Ops that can autocast to bfloat16"), whose bf16 LSTM needs AVX512-BF16 or AMX
    (elsewhere it raises "could not create a primitive descriptor for the LSTM forward
    propagation primitive": seen on this kit's 2-vCPU AMD EPYC, torch 2.13). torch's own
    CPU feature checks (torch/cpu/__init__.py)."""
    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


class LSTMLayer(nn.Module):
    """One LSTM layer, batch first, giving every step's output (no state kept between
    batches), so that it is a module a pipeline can cut after. Under CPU bf16 autocast on
    a CPU without oneDNN's bf16 LSTM (cpu_has_bf16_lstm), the layer runs in fp32 and the
    record's forward dtype says what the layers computed in."""

    def __init__(self, inputs: int, hidden: int):
        super().__init__()
        self.lstm = nn.LSTM(inputs, hidden, batch_first=True)

    def forward(self, x):
        if (x.device.type == "cpu" and torch.is_autocast_enabled("cpu")
                and torch.get_autocast_dtype("cpu") == torch.bfloat16 and not cpu_has_bf16_lstm()):
            with torch.autocast("cpu", enabled=False):
                return self.lstm(x.float())[0]
        return self.lstm(x)[0]


class LastStep(nn.Module):
    def forward(self, x):
        return x[:, -1]


class SequenceClassifier(nn.Module):
    def __init__(self, features: int, classes: int, hidden: int = HIDDEN):
        super().__init__()
        self.rows = Rows()
        self.lstm1 = LSTMLayer(features, hidden)
        self.lstm2 = LSTMLayer(hidden, hidden)
        self.last = LastStep()
        self.fc = nn.Linear(hidden, classes)
        self.out = nn.LogSoftmax(dim=1)

    def forward(self, x):
        return self.out(self.fc(self.last(self.lstm2(self.lstm1(self.rows(x))))))


def build(channels: int, size: int, classes: int) -> nn.Module:
    return SequenceClassifier(channels * size, classes)


def layers(model: SequenceClassifier) -> list[nn.Module]:
    """forward, module by module (the model's own modules: same parameters)."""
    return [model.rows, model.lstm1, model.lstm2, model.last, model.fc, model.out]


def fsdp_units(model: SequenceClassifier) -> list[nn.Module]:
    """FSDP2 units before the root: each LSTM layer (nn.LSTM re-reads its flat weights
    when the parameters were swapped: torch/nn/modules/rnn.py, _weights_have_changed)."""
    return [model.lstm1, model.lstm2]

