"""Data sets as whole tensors: IDX files (MNIST), scikit-learn's digits, synthetic.

Each split is one tensor of images and one of labels, put on the training device
once; an epoch's shard is gathered with one index operation, and a step is a slice
of it, so the hot path does no per-sample Python work.
"""
from __future__ import annotations

import gzip
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from lab import models
from lab.common.config import DIGITS_TEST
from lab.common.fetch import DataUnavailable, ensure_mnist  # noqa: F401 (part of this module's API)

# MNIST's mean and standard deviation, the normalisation of Horovod's example.
MNIST_MEAN, MNIST_STD = 0.1307, 0.3081

# IDX type codes (http://yann.lecun.com/exdb/mnist/, "THE IDX FILE FORMAT").
_IDX_TYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


@dataclass
class Split:
    images: torch.Tensor   # float32, N x C x H x W, normalised
    labels: torch.Tensor   # int64, N

    def __len__(self) -> int:
        return self.labels.shape[0]

    def to(self, device) -> "Split":
        return Split(self.images.to(device), self.labels.to(device))

    def take(self, sel) -> tuple[torch.Tensor, torch.Tensor]:
        """The images and labels at `sel` (a slice, or a tensor of indices)."""
        return self.images[sel], self.labels[sel]


@dataclass
class PooledSplit(Split):
    """A synthetic split of len(labels) samples whose images repeat a smaller pool:
    sample i's image is images[i % len(images)]. Random images teach nothing, so a
    pool gives the same steps as distinct ones, and is made in a fraction of the time
    (60,000 MNIST-shaped images are 188 MB of torch.randn per rank)."""

    def to(self, device) -> "PooledSplit":
        return PooledSplit(self.images.to(device), self.labels.to(device))

    def take(self, sel) -> tuple[torch.Tensor, torch.Tensor]:
        if isinstance(sel, slice):
            sel = torch.arange(len(self), device=self.labels.device)[sel]
        return self.images[sel % self.images.shape[0]], self.labels[sel]


@dataclass
class Dataset:
    name: str
    train: Split
    test: Split
    channels: int
    size: int          # height = width
    classes: int


# ---------------------------------------------------------------- IDX format

def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Parse an IDX file (optionally gzipped) into an array of its shape."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        raw = f.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise ValueError(f"{path} is not an IDX file (bad magic number)")
    type_code, ndim = raw[2], raw[3]
    if type_code not in _IDX_TYPES:
        raise ValueError(f"{path}: unknown IDX type code 0x{type_code:02x}")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise ValueError(f"{path}: truncated IDX header")
    shape = struct.unpack(f">{ndim}I", raw[4:header])
    dtype = np.dtype(_IDX_TYPES[type_code])
    count = int(np.prod(shape)) if shape else 1
    if len(raw) - header != count * dtype.itemsize:
        raise ValueError(f"{path}: IDX header says {shape} of {dtype} "
                         f"but the file holds {len(raw) - header} data bytes")
    data = np.frombuffer(raw, dtype=dtype, offset=header, count=count)
    return data.reshape(shape).astype(dtype.newbyteorder("="))


def write_idx(path: str | os.PathLike, array: np.ndarray) -> None:
    """Write an array as an IDX file (gzipped if the name ends in .gz)."""
    path = Path(path)
    codes = {np.dtype(v).newbyteorder("="): k for k, v in _IDX_TYPES.items()}
    dtype = array.dtype.newbyteorder("=")
    if dtype not in codes:
        raise ValueError(f"IDX cannot hold {array.dtype}")
    header = bytes([0, 0, codes[dtype], array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    body = array.astype(np.dtype(_IDX_TYPES[codes[dtype]])).tobytes()
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wb") as f:
        f.write(header + body)


# ---------------------------------------------------------------- MNIST

def _normalise(images_0_1: torch.Tensor) -> torch.Tensor:
    return (images_0_1 - MNIST_MEAN) / MNIST_STD


def load_mnist(data_dir) -> Dataset:
    """MNIST from the IDX files in data_dir (or data_dir/mnist), downloaded first if absent."""
    root = ensure_mnist(data_dir)

    def split(prefix):
        x = read_idx(root / f"{prefix}-images-idx3-ubyte.gz")
        y = read_idx(root / f"{prefix}-labels-idx1-ubyte.gz")
        if x.ndim != 3 or y.ndim != 1 or x.shape[0] != y.shape[0]:
            raise ValueError(f"{root}: {prefix} images {x.shape} and labels {y.shape} do not match")
        images = torch.from_numpy(x.astype(np.float32) / 255.0).unsqueeze(1)
        return Split(_normalise(images), torch.from_numpy(y.astype(np.int64)))

    try:
        train, test = split("train"), split("t10k")
    except (ValueError, OSError, EOFError) as e:
        raise DataUnavailable(f"the MNIST files in {root} cannot be read ({e}): delete them to "
                              f"download a fresh copy, or pass another --data-dir") from None
    return Dataset("mnist", train, test, channels=1, size=train.images.shape[-1], classes=10)


def digits_file() -> Path:
    """The file scikit-learn's load_digits reads (sklearn/datasets/data/digits.csv.gz in
    its package: one row per image, 64 pixel values 0..16 then the digit), found without
    importing scikit-learn: its import (SciPy's with it) took about as long as torch's in
    every rank of a `--data digits` run."""
    import importlib.util
    spec = importlib.util.find_spec("sklearn")     # a top-level package: located, not run
    path = (Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / "digits.csv.gz"
            if spec and spec.submodule_search_locations else None)
    if path is None or not path.is_file():
        raise DataUnavailable("--data digits needs scikit-learn (its bundled digits): pip install "
                              "scikit-learn (or install the kit with its 'train' extra)")
    return path


def load_digits(seed: int = 0, test_size: int = DIGITS_TEST) -> Dataset:
    """scikit-learn's 1,797 bundled 8x8 handwritten digits, upsampled to 20x20 and centred
    in 28x28 (MNIST's layout: digits fit a 20x20 box), split into train and test."""
    with gzip.open(digits_file(), "rt") as f:
        rows = np.loadtxt(f, delimiter=",")
    images, target = rows[:, :-1].reshape(-1, 8, 8), rows[:, -1]
    x = torch.from_numpy(images.astype(np.float32) / 16.0).unsqueeze(1)
    x = torch.nn.functional.interpolate(x, size=(20, 20), mode="bilinear", align_corners=False)
    x = torch.nn.functional.pad(x, (4, 4, 4, 4)).clamp_(0, 1)
    y = torch.from_numpy(target.astype(np.int64))
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    test_idx, train_idx = order[:test_size], order[test_size:]
    x = _normalise(x)
    return Dataset("digits", Split(x[train_idx], y[train_idx]), Split(x[test_idx], y[test_idx]),
                   channels=1, size=28, classes=10)


# Distinct images a synthetic split makes at most: 32 MiB of float32 (10,699 of MNIST's
# shape, 55 of ImageNet's); beyond that its samples repeat them (PooledSplit).
SYNTHETIC_POOL_BYTES = 32 * 2**20


def synthetic(channels: int, size: int, classes: int, train_size: int, test_size: int,
              seed: int = 0) -> Dataset:
    """Random images and labels: nothing to learn, for pure throughput. Every sample has
    its own label; the images of a split larger than SYNTHETIC_POOL_BYTES repeat a pool."""
    g = torch.Generator().manual_seed(seed)
    pool = max(1, SYNTHETIC_POOL_BYTES // (4 * channels * size * size))

    def split(n):
        images = torch.randn(min(n, pool), channels, size, size, generator=g)
        labels = torch.randint(0, classes, (n,), generator=g)
        return Split(images, labels) if n <= pool else PooledSplit(images, labels)

    return Dataset("synthetic", split(train_size), split(test_size), channels, size, classes)


def pad_to(ds: Dataset, size: int) -> Dataset:
    """The data set with its images centred in size x size, the border its background
    (a blank pixel, normalised as the images are); unchanged where they are that large."""
    if ds.size >= size:
        return ds
    before = (size - ds.size) // 2
    after = size - ds.size - before
    blank = float(_normalise(torch.zeros(())))

    def pad(split: Split) -> Split:
        images = torch.nn.functional.pad(split.images, (before, after, before, after), value=blank)
        return Split(images, split.labels)

    return Dataset(ds.name, pad(ds.train), pad(ds.test), ds.channels, size, ds.classes)


def load(cfg) -> Dataset:
    """The data set a RunConfig asks for, on the CPU, at the size its model takes (the
    model spec's input: MNIST and the digits padded to VGG-16's 32x32)."""
    _, size, _ = models.get(cfg.model).input(cfg.data)
    if cfg.data == "mnist":
        return pad_to(load_mnist(cfg.data_dir), size)
    if cfg.data == "digits":
        return pad_to(load_digits(seed=cfg.seed), size)
    # Synthetic: the model's own input (its spec: MNIST's shape for the MNIST network and
    # the LSTM, ImageNet's for ResNet-50 and VGG-16); a test set of an eighth of that.
    n = cfg.train_size()
    channels, size, classes = models.get(cfg.model).input(cfg.data)
    return synthetic(channels, size, classes, n, max(n // 8, 1), seed=cfg.seed)


# ---------------------------------------------------------------- sharding

def shard_indices(n: int, rank: int, world: int, epoch: int, seed: int) -> torch.Tensor:
    """This rank's sample indices for an epoch: a permutation drawn from (seed, epoch),
    cut into `world` equal, disjoint blocks (the remainder is dropped so every rank
    takes the same number of steps)."""
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is outside a world of {world}")
    per = n // world
    g = torch.Generator().manual_seed(seed * 100003 + epoch)
    perm = torch.randperm(n, generator=g)
    return perm[rank * per:(rank + 1) * per]


def eval_indices(n: int, rank: int, world: int) -> torch.Tensor:
    """This rank's share of the test set: every sample counted by exactly one rank."""
    return torch.arange(rank, n, world)
