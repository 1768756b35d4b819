"""IDX reader, MNIST fetching and its errors, the digits set, sharding."""
import hashlib
import http.server
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch

from lab.worker import data
from tests.conftest import make_mnist_like


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16, np.int32, np.float32, np.float64])
@pytest.mark.parametrize("suffix", [".idx", ".idx.gz"])
def test_idx_round_trip(tmp_path, dtype, suffix):
    a = (np.arange(2 * 3 * 4) * 7 - 40).astype(dtype).reshape(2, 3, 4)
    path = tmp_path / f"a{suffix}"
    data.write_idx(path, a)
    b = data.read_idx(path)
    assert b.shape == (2, 3, 4) and b.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(a, b)


def test_idx_is_big_endian_as_the_format_says(tmp_path):
    # Hand-made file: magic 0x00000C01 (int32, 1 dim), 2 items, big-endian values 1 and 256.
    path = tmp_path / "x.idx"
    path.write_bytes(bytes([0, 0, 0x0C, 1, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 1, 0]))
    assert data.read_idx(path).tolist() == [1, 256]


@pytest.mark.parametrize("payload,message", [
    (b"\x01\x02\x08\x01", "bad magic"),
    (bytes([0, 0, 0x42, 1, 0, 0, 0, 1, 0]), "unknown IDX type"),
    (bytes([0, 0, 0x08, 2, 0, 0, 0, 2]), "truncated"),
    (bytes([0, 0, 0x08, 1, 0, 0, 0, 5, 1, 2]), "holds 2 data bytes"),
])
def test_idx_rejects_bad_files(tmp_path, payload, message):
    path = tmp_path / "bad.idx"
    path.write_bytes(payload)
    with pytest.raises(ValueError, match=message):
        data.read_idx(path)


def test_load_mnist_reads_generated_files(tmp_path):
    root = make_mnist_like(tmp_path / "m", train=100, test=30)
    ds = data.load_mnist(tmp_path / "m")
    assert ds.train.images.shape == (100, 1, 28, 28) and ds.test.images.shape == (30, 1, 28, 28)
    assert ds.train.images.dtype == torch.float32 and ds.train.labels.dtype == torch.int64
    raw = data.read_idx(root / "train-images-idx3-ubyte.gz")
    expected = (raw[0] / 255.0 - data.MNIST_MEAN) / data.MNIST_STD
    np.testing.assert_allclose(ds.train.images[0, 0].numpy(), expected, rtol=1e-5, atol=1e-5)


def test_no_network_and_no_copy_names_the_ways_out(tmp_path, no_network_mirrors):
    with pytest.raises(data.DataUnavailable) as e:
        data.load_mnist(tmp_path / "empty")
    msg = str(e.value)
    assert "--data synthetic" in msg and "--data-dir" in msg and "127.0.0.1:9" in msg


@pytest.fixture
def mirror(tmp_path):
    """A real HTTP server on loopback serving a folder: a local MNIST mirror."""
    served = tmp_path / "served"
    served.mkdir()

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a, **k):
            super().__init__(*a, directory=str(served), **k)

        def log_message(self, *a):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield served, f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def test_download_from_mirror_verifies_checksums(tmp_path, mirror):
    served, url = mirror
    make_mnist_like(served, train=50, test=20)
    files = {p.name: hashlib.md5(p.read_bytes()).hexdigest() for p in served.iterdir()}
    root = data.ensure_mnist(tmp_path / "cache", mirrors=("http://127.0.0.1:9/", url), files=files)
    assert root == tmp_path / "cache" / "mnist"
    for name, md5 in files.items():
        assert hashlib.md5((root / name).read_bytes()).hexdigest() == md5
    # A second call finds the complete set and downloads nothing (the mirror is gone).
    assert data.ensure_mnist(tmp_path / "cache", mirrors=("http://127.0.0.1:9/",), files=files) == root


def test_download_rejects_a_corrupt_mirror(tmp_path, mirror):
    served, url = mirror
    make_mnist_like(served, train=50, test=20)
    files = {p.name: "0" * 32 for p in served.iterdir()}
    with pytest.raises(data.DataUnavailable, match="checksum mismatch"):
        data.ensure_mnist(tmp_path / "cache", mirrors=(url,), files=files)
    assert not any((tmp_path / "cache" / "mnist").glob("*-ubyte.gz"))


def test_digits_are_real_offline_images():
    ds = data.load_digits(seed=1)
    assert len(ds.train) + len(ds.test) == 1797 and len(ds.test) == 300
    assert ds.train.images.shape[1:] == (1, 28, 28)
    # MNIST layout: the 4-pixel border is background, the digit lies in the 20x20 box.
    background = (0 - data.MNIST_MEAN) / data.MNIST_STD
    assert torch.allclose(ds.train.images[:, :, :4, :], torch.tensor(background))
    assert ds.train.images[:, :, 4:24, 4:24].max() > 2.0
    assert set(ds.train.labels.tolist()) == set(range(10))
    # Same seed, same split; train and test never share an image.
    again = data.load_digits(seed=1)
    assert torch.equal(ds.test.labels, again.test.labels)
    flat_train = {tuple(x.flatten().tolist()) for x in ds.train.images[:200]}
    assert not any(tuple(x.flatten().tolist()) in flat_train for x in ds.test.images)


def test_digits_read_from_the_file_are_scikit_learns_own():
    """The digits come from the file scikit-learn's load_digits reads, without importing
    scikit-learn: the same images and labels as its loader returns, and a process that
    loads them has not imported it (nor SciPy)."""
    sklearn_datasets = pytest.importorskip("sklearn.datasets")
    theirs = sklearn_datasets.load_digits()
    ds = data.load_digits(seed=3, test_size=0)
    assert len(ds.train) == len(theirs.target) == 1797
    # the split's order is a seeded permutation: undo it and compare image by image
    order = torch.randperm(1797, generator=torch.Generator().manual_seed(3))
    mine = torch.empty_like(ds.train.labels)
    mine[order] = ds.train.labels
    assert torch.equal(mine, torch.from_numpy(theirs.target.astype("int64")))
    x = torch.from_numpy(theirs.images.astype("float32") / 16.0).unsqueeze(1)
    x = torch.nn.functional.interpolate(x, size=(20, 20), mode="bilinear", align_corners=False)
    x = data._normalise(torch.nn.functional.pad(x, (4, 4, 4, 4)).clamp_(0, 1))
    assert torch.equal(ds.train.images, x[order])
    code = ("import sys; from lab.worker import data; data.load_digits(); "
            "print(sorted(m for m in ('sklearn', 'scipy') if m in sys.modules))")
    cp = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0 and cp.stdout.strip() == "[]", cp.stdout + cp.stderr


def test_digits_without_scikit_learn_is_one_sentence(monkeypatch):
    import importlib.util
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(data.DataUnavailable, match="pip install scikit-learn"):
        data.load_digits()


@pytest.mark.parametrize("n,world", [(60000, 1), (60000, 2), (1000, 3), (10, 4)])
def test_shards_are_disjoint_equal_and_reshuffled(n, world):
    for epoch in range(2):
        shards = [data.shard_indices(n, r, world, epoch, seed=7) for r in range(world)]
        sizes = {len(s) for s in shards}
        assert sizes == {n // world}
        allidx = torch.cat(shards)
        assert len(set(allidx.tolist())) == len(allidx)  # disjoint
        assert allidx.min() >= 0 and allidx.max() < n
    e0 = data.shard_indices(n, 0, world, 0, seed=7)
    e1 = data.shard_indices(n, 0, world, 1, seed=7)
    if n // world > 1:
        assert not torch.equal(e0, e1)  # a new order each epoch
    assert torch.equal(e0, data.shard_indices(n, 0, world, 0, seed=7))  # reproducible
    assert not torch.equal(data.shard_indices(n, 0, world, 0, seed=8), e0) or n // world < 2


def test_shard_rank_out_of_range():
    with pytest.raises(ValueError):
        data.shard_indices(10, 2, 2, 0, 0)


def test_eval_indices_count_every_test_sample_once():
    parts = [data.eval_indices(1001, r, 3) for r in range(3)]
    assert sorted(torch.cat(parts).tolist()) == list(range(1001))


def test_large_synthetic_splits_repeat_a_pool_of_images_with_every_label_their_own():
    pool = data.SYNTHETIC_POOL_BYTES // (4 * 28 * 28)
    assert pool == 10_699
    ds = data.synthetic(1, 28, 10, 60_000, 10_000, seed=3)
    tr = ds.train
    assert isinstance(tr, data.PooledSplit) and len(tr) == 60_000 and tr.images.shape[0] == pool
    idx = torch.tensor([0, 5, pool, pool + 5, 59_999])
    x, y = tr.take(idx)
    assert torch.equal(x[0], x[2]) and torch.equal(x[1], x[3]) and not torch.equal(x[0], x[1])
    assert torch.equal(x[4], tr.images[59_999 % pool]) and torch.equal(y, tr.labels[idx])
    xs, ys = tr.take(slice(pool - 1, pool + 1))          # slices wrap the same way
    assert torch.equal(xs[1], tr.images[0]) and torch.equal(ys, tr.labels[pool - 1:pool + 1])
    # The same seed, the same data; a split within the pool is a plain one.
    assert torch.equal(data.synthetic(1, 28, 10, 60_000, 10_000, seed=3).train.labels, tr.labels)
    small = data.synthetic(1, 28, 10, 512, 1, seed=3).train
    assert type(small) is data.Split and small.images.shape[0] == 512
    # ImageNet-shaped: 55 distinct images, so a ResNet-50 batch of 64 repeats 9 of them.
    big = data.synthetic(3, 224, 1000, 64, 8).train
    assert big.images.shape[0] == 55 and big.take(slice(None))[0].shape[0] == 64
