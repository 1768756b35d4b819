"""The published comparisons (lab.report.published, `invoke published`) and the data they
read (lab.models.published_gradients): the data file against torchvision's models (skipped
where torchvision does not import, as in CI's CPU image) and against the kit's own MNIST CNN
and ResNet-50; the predictions computed from their inputs, moving the way their inputs
move; the T4 report's error computed from its published figures. No timing is measured."""
import dataclasses
import json
import subprocess
import sys

import pytest
from conftest import REPO, TORCHVISION_MISSING

from lab.models import published_gradients as pg
from lab.report import cost_model as cm
from lab.report import published

needs_torchvision = pytest.mark.skipif(TORCHVISION_MISSING is not None,
                                       reason=f"torchvision does not import: {TORCHVISION_MISSING}")


def _reverse_registration(model):
    return [(n, list(p.shape), p.numel() * pg.DTYPE_BYTES) for n, p in reversed(list(model.named_parameters()))]


@needs_torchvision
@pytest.mark.parametrize("name", list(pg.TORCHVISION))
def test_the_data_file_holds_torchvisions_tensors_in_ready_order_and_its_flops(name):
    import torchvision
    function, keywords, _ = pg.TORCHVISION[name]
    model = getattr(torchvision.models, function)(**keywords)
    g = pg.load(name)
    assert list(zip(g.names, map(list, g.shapes), g.bytes)) == _reverse_registration(model)
    assert g.params == sum(p.numel() for p in model.parameters())
    # torchvision lists its weights' multiply-adds in billions (meta["_ops"], called GFLOPS)
    ops = getattr(torchvision.models, pg.WEIGHTS[name]).DEFAULT.meta["_ops"]
    assert g.forward_flops / 2 / 1e9 == pytest.approx(ops, rel=0.01)


@needs_torchvision
def test_the_writer_reproduces_the_data_file(tmp_path):
    """The ready shares too: VGG-16's entry recomputed by the writer's own code."""
    assert pg.measure("vgg16") == json.loads(pg.DATA_FILE.read_text())["models"]["vgg16"]


def test_the_kits_mnist_cnn_and_resnet50_are_the_data_files():
    """Without torchvision: the kit's MNIST CNN recomputed in full, and its ResNet-50 (torch.nn's
    own where torchvision is missing) has the file's torchvision ResNet-50 tensors."""
    pytest.importorskip("torch")
    from lab.models.resnet50 import net as resnet50
    assert pg.measure("mnist") == json.loads(pg.DATA_FILE.read_text())["models"]["mnist"]
    g = pg.load("resnet50")
    assert list(zip(g.names, map(list, g.shapes), g.bytes)) == _reverse_registration(resnet50.build(3, 224, 1000))


def test_the_data_files_ready_shares_grow_along_the_ready_order_and_end_with_the_whole_backward():
    for name in pg.NAMES:
        g = pg.load(name)
        assert all(a <= b for a, b in zip(g.ready_share, g.ready_share[1:])), name
        assert g.ready_share[-1] == 1.0 and 0 < g.ready_share[0] < 0.05
    vgg = pg.load("vgg16")      # the classifier's 495 MB are ready within the first 1% of the backward
    assert sum(b for b, r in zip(vgg.bytes, vgg.ready_share) if r < 0.01) > 0.89 * vgg.total_bytes


def test_a_missing_data_file_or_model_is_one_sentence(tmp_path):
    with pytest.raises(pg.DataFileError, match="python -m lab.models.published_gradients --write"):
        pg.load("vgg16", tmp_path / "none.json")
    with pytest.raises(pg.DataFileError, match="has no model 'alexnet'"):
        pg.load("alexnet")


def test_ready_shares_move_the_exposed_time_of_horovods_schedule():
    """cost_model.horovod_schedule with each tensor's ready share: ready late, more exposed;
    without them, the gradients ready in proportion to their bytes, as before."""
    fit = cm.Fit(1e-5, 1e-9, 0, 0, "set", backend="nccl")
    sizes = [4e6] * 10
    late = cm.horovod_schedule(4e7, 1.0, 0.1, fit, "allreduce", 8, 10, tensor_bytes=sizes, ready_share=[1.0] * 10)
    early = cm.horovod_schedule(4e7, 1.0, 0.1, fit, "allreduce", 8, 10, tensor_bytes=sizes, ready_share=[0.01] * 10)
    by_bytes = cm.horovod_schedule(4e7, 1.0, 0.1, fit, "allreduce", 8, 10, tensor_bytes=sizes)
    uniform = cm.horovod_schedule(4e7, 1.0, 0.1, fit, "allreduce", 8, 10, tensor_bytes=sizes,
                                  ready_share=[(k + 1) / 10 for k in reversed(range(10))])
    assert early["exposed_s"] < by_bytes["exposed_s"] < late["exposed_s"]
    assert uniform == by_bytes


def test_the_512_gpu_prediction_moves_with_the_link_and_the_gradients():
    """Computed, not written in: a ten times slower network lowers every model's predicted
    efficiency; VGG-16's, bandwidth-bound, falls with every slower rate and rises with every
    faster one (Inception V3's, latency-bound, may rise a little on a slower link: its cycles
    last longer and fuse more, so fewer 1022-step rings run); twice VGG-16's bytes lower it;
    each row's error is its prediction less the published figure."""
    def at(gbits):
        return {r["model"]: r for r in published.horovod_512(dataclasses.replace(published.HOROVOD_512,
                                                                                 link_gbits=gbits))}
    base, slow, fast, tenth = published.horovod_512(), at(10), at(100), at(2.5)
    base = {r["model"]: r for r in base}
    for m in base:
        assert tenth[m]["efficiency"] < base[m]["efficiency"]
        assert base[m]["error_points"] == pytest.approx(100 * (base[m]["efficiency"] - base[m]["published"]))
    assert slow["vgg16"]["efficiency"] < base["vgg16"]["efficiency"] - 0.1 < fast["vgg16"]["efficiency"] - 0.1
    assert base["vgg16"]["dominant"] == "bytes on the link"
    vgg = pg.load("vgg16")
    heavier = dataclasses.replace(vgg, bytes=tuple(2 * b for b in vgg.bytes))
    step = base["vgg16"]["step_one_s"]
    assert published.predict(heavier, step, published.HOROVOD_512)["efficiency"] < base["vgg16"]["efficiency"]
    # one more microsecond a ring step costs 1022 more a collective
    slower_steps = dataclasses.replace(published.HOROVOD_512, step_latency_s=published.HOROVOD_512.step_latency_s + 1e-6)
    assert published.predict(vgg, step, slower_steps)["step_s"] > base["vgg16"]["step_s"]


def test_resnet101s_single_gpu_figure_lies_between_resnet50s_and_resnet152s():
    r101 = published.resnet101_images_s()
    assert published.P100_IMAGES_S["resnet152"] < r101 < published.P100_IMAGES_S["resnet50"]


def test_the_t4_error_is_computed_from_the_published_figures_and_no_target_feeds_its_prediction(monkeypatch):
    t = published.t4_mnist()
    rows = {r["workers"]: r for r in t["rows"]}
    for n, r in rows.items():
        assert r["error"] == pytest.approx(r["predicted"] / published.T4_IMAGES_S[n] - 1)
    assert rows[1]["error"] == pytest.approx(0.0)
    # the report's images/s: MNIST's 60,000 over each run's wall time; the serial part from 1 and 2 GPUs
    assert all(abs(v - 1) < 0.01 for v in t["wall_ratio"].values())
    assert t["serial_s"] == pytest.approx(2 * published.T4_WALL_S[2] - published.T4_WALL_S[1])
    # another published 4-GPU figure changes its error, not its prediction
    monkeypatch.setitem(published.T4_IMAGES_S, 4, 2000.0)
    again = {r["workers"]: r for r in published.t4_mnist()["rows"]}
    assert again[4]["predicted"] == pytest.approx(rows[4]["predicted"])
    assert again[4]["error"] == pytest.approx(rows[4]["predicted"] / 2000.0 - 1)
    # another 1-GPU figure moves every prediction
    monkeypatch.setitem(published.T4_IMAGES_S, 1, 600.0)
    moved = {r["workers"]: r for r in published.t4_mnist()["rows"]}
    assert all(moved[n]["predicted"] > rows[n]["predicted"] for n in (2, 3, 4))


def _invoke(*args):
    return subprocess.run([sys.executable, "-m", "invoke", "published", *args], cwd=REPO, capture_output=True,
                          text=True)


def test_invoke_published_prints_its_sources_assumptions_and_the_table():
    """The commands docs/pages/published.md shows, and the one with both comparisons."""
    cp = _invoke("--comparison", "horovod-512")
    assert cp.returncode == 0, cp.stderr
    out = cp.stdout
    for text in ("docs/benchmarks.rst", "tensorflow/docs site/en/r1/guide/performance/benchmarks.md",
                 pg.DATA_FILE.name, "NCCL 2.5.6", "fixed before the prediction"):
        assert text in out, text
    assert "T4" not in out
    for r in published.horovod_512():
        assert f"{100 * r['efficiency']:8.0f}% {100 * r['published']:8.0f}%" in out
    what_if = _invoke("--comparison", "horovod-512", "--link-gbits", "10")
    assert what_if.returncode == 0 and "on 10 Gbit/s instead of the published 25" in what_if.stdout
    both = _invoke()
    assert both.returncode == 0 and "a course lab's filled report (not public)" in both.stdout
    assert "serial part" in both.stdout and "docs/benchmarks.rst" in both.stdout
    bad = _invoke("--comparison", "horovod")
    assert bad.returncode == 2 and bad.stderr.strip() == (
        "error: no comparison 'horovod': choose all or one of horovod-512, t4-mnist")
    rate = _invoke("--link-gbits", "0")
    assert rate.returncode == 2 and "give the network's rate in Gbit/s" in rate.stderr
