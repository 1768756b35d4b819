"""Fetching MNIST: standard library only, so the host side (lab.host.run.bench) can fetch the
files once before the ranks start, without importing torch."""
from __future__ import annotations

import gzip
import hashlib
import os
import struct
import tempfile
import urllib.request
import zlib
from pathlib import Path

from lab.common.config import ConfigError

# The four MNIST files and their MD5 sums, as listed by torchvision's MNIST data set
# (torchvision/datasets/mnist.py); the mirrors are the ones it tries, in that order.
MNIST_FILES = {
    "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
    "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
    "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
    "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
}
MNIST_MIRRORS = (
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "http://yann.lecun.com/exdb/mnist/",
)


class DataUnavailable(ConfigError):
    """The data cannot be had; the message says what to do instead."""


def _md5(path: Path) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _download(name: str, md5: str, dest: Path, mirrors, timeout: float) -> None:
    errors = []
    for mirror in mirrors:
        url = mirror + name
        try:
            with urllib.request.urlopen(url, timeout=timeout) as r:
                payload = r.read()
        except Exception as e:  # network errors come in many types
            errors.append(f"{url}: {e}")
            continue
        if hashlib.md5(payload).hexdigest() != md5:
            errors.append(f"{url}: checksum mismatch")
            continue
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{name}.")
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
        os.replace(tmp, dest)  # atomic: concurrent ranks never see half a file
        return
    raise DataUnavailable(
        f"MNIST is not in {dest.parent} and could not be downloaded ({'; '.join(errors)}): "
        f"use --data synthetic or --data digits to run offline, or put the four MNIST "
        f"files ({', '.join(MNIST_FILES)}) in a directory and pass --data-dir DIR")


def mirrors_from_env() -> tuple[str, ...]:
    """LAB_MNIST_MIRRORS (space-separated base URLs) replaces the mirror list."""
    env = os.environ.get("LAB_MNIST_MIRRORS", "").split()
    return tuple(m if m.endswith("/") else m + "/" for m in env) or MNIST_MIRRORS


def ensure_mnist(data_dir: str | os.PathLike, mirrors=None, timeout: float = 30,
                 files: dict | None = None) -> Path:
    """The folder holding the four MNIST files: data_dir or data_dir/mnist when either
    has all four, else data_dir/mnist after downloading what is missing from the first
    mirror that serves it with the right checksum."""
    files = files or MNIST_FILES
    mirrors = mirrors or mirrors_from_env()
    root = Path(data_dir)
    for candidate in (root, root / "mnist"):
        if all((candidate / n).is_file() for n in files):
            # A complete set is used as it is: files a user put there, or ones this
            # function downloaded, verified, and moved in atomically.
            return candidate
    root = root / "mnist"
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DataUnavailable(f"cannot create the data directory {root} ({e.strerror}): "
                              f"pass a writable --data-dir DIR") from None
    for name, md5 in files.items():
        path = root / name
        if path.is_file() and _md5(path) == md5:
            continue
        _download(name, md5, path, mirrors, timeout)
    return root


# Bytes per value of each IDX type code (the IDX format as MNIST's page describes it).
IDX_ITEMSIZE = {0x08: 1, 0x09: 1, 0x0B: 2, 0x0C: 4, 0x0D: 4, 0x0E: 8}


def idx_shape(path: Path) -> tuple[int, ...]:
    """The shape an IDX file (optionally gzipped) declares, checked against the bytes
    it holds; ValueError saying what is wrong."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            head = f.read(4)
            if len(head) < 4 or head[0] or head[1] or head[2] not in IDX_ITEMSIZE:
                raise ValueError("not an IDX file (bad magic number)")
            ndim = head[3]
            dims = f.read(4 * ndim)
            if len(dims) < 4 * ndim:
                raise ValueError("its header is cut short")
            shape = struct.unpack(f">{ndim}I", dims)
            size = 0
            for chunk in iter(lambda: f.read(1 << 20), b""):
                size += len(chunk)
    except (OSError, EOFError, zlib.error) as e:
        raise ValueError(f"it cannot be read ({e})") from None
    want = IDX_ITEMSIZE[head[2]]
    for d in shape:
        want *= d
    if size != want:
        raise ValueError(f"its header declares {'x'.join(map(str, shape))} values but it holds "
                         f"{size} bytes of them")
    return shape


def mnist_train_size(folder: str | os.PathLike) -> int:
    """Check the four MNIST files in `folder` (as the ranks will read them) and return
    the number of training images; DataUnavailable naming the bad file otherwise."""
    folder = Path(folder)
    shapes = {}
    for name in MNIST_FILES:
        try:
            shapes[name] = idx_shape(folder / name)
        except ValueError as e:
            raise DataUnavailable(f"{folder / name} is not a usable MNIST file: {e}; delete it "
                                  f"(it is downloaded again) or put a good copy there") from None
    for prefix in ("train", "t10k"):
        images = shapes[f"{prefix}-images-idx3-ubyte.gz"]
        labels = shapes[f"{prefix}-labels-idx1-ubyte.gz"]
        if len(images) != 3 or len(labels) != 1 or images[0] != labels[0]:
            raise DataUnavailable(f"the MNIST {prefix} files in {folder} do not match ({images} "
                                  f"images, {labels} labels): replace them with a good copy")
    return shapes["train-images-idx3-ubyte.gz"][0]
