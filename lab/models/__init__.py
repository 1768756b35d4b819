"""The models. Each is one folder, lab/models/<name>/: its __init__ registers a ModelSpec
(facts only, standard library at import, read on the host, in the report and in a rank)
and its net.py holds the torch code a rank runs: build(channels, size, classes), the
modules a pipeline cuts (layers), the units FSDP shards (fsdp_units). Nothing else in the
kit names a model: adding one is its folder, a line at the end of this file, and tests.

The input a model trains on is the data set's (DATA_INPUTS: MNIST and the digits are
28x28 grey images of 10 classes), padded to the model's `min_size` where it takes no
smaller (lab.worker.data.pad_to), or, on synthetic data, the model's own (its spec's
`synthetic`); the compute ceiling measures the same input the run trains on."""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field

# (channels, size, classes) of each real data set, as lab.worker.data loads it.
DATA_INPUTS = {"mnist": (1, 28, 10), "digits": (1, 28, 10)}


@dataclass(frozen=True)
class ModelSpec:
    name: str                          # the --model value
    about: str                         # one line: --help, the README
    synthetic: tuple[int, int, int]    # (channels, size, classes) of its synthetic data
    most_stages: int                   # parameterised modules of net.layers(model): a
                                       # pipeline cuts only before one, so each stage has some
    loss: str = "cross_entropy"        # or "nll" when the network ends in log-softmax
    synthetic_samples: int = 0         # training samples of synthetic data (0: 8 batches)
    needs: tuple[str, ...] = ()        # packages beyond torch (import names), checked first
    ceiling_steps: tuple[int, int] = (200, 10)   # (steps, warm-up) the ceiling times
    optimizer: str = "sgd"             # sgd (RunConfig's lr and momentum) or adam (its lr)
    refuses: dict = field(default_factory=dict)  # strategy -> why it cannot run this model
    channels_last: bool = False        # a CNN: channels-last on GPUs below fp32 (lab.worker.precision)
    min_size: int = 0                  # the smallest image side it takes: a data set's smaller
                                       # images are padded to it (lab.worker.data.pad_to)

    @property
    def net(self):
        """The module with the model's torch code (imports torch: inside a rank only)."""
        return importlib.import_module(f"{__name__}.{self.name}.net")

    def input(self, data: str) -> tuple[int, int, int]:
        """(channels, size, classes) of what the model trains on with --data `data`."""
        channels, size, classes = DATA_INPUTS.get(data, self.synthetic)
        return channels, max(size, self.min_size), classes

    def synthetic_train_size(self, batch_size: int) -> int:
        return self.synthetic_samples or 8 * batch_size


_SPECS: dict[str, ModelSpec] = {}


def register(spec: ModelSpec) -> ModelSpec:
    if spec.name in _SPECS:
        raise ValueError(f"model {spec.name!r} is registered twice")
    _SPECS[spec.name] = spec
    return spec


def names() -> tuple[str, ...]:
    return tuple(_SPECS)


def get(name: str) -> ModelSpec:
    try:
        return _SPECS[name]
    except KeyError:
        raise KeyError(f"unknown model {name!r}: choose one of {', '.join(_SPECS)}") from None


# The registered models (their folders), in the order --help lists them.
for _folder in ("mnist", "resnet50", "lstm", "vgg16"):
    importlib.import_module(f"{__name__}.{_folder}")
