"""Published scaling results predicted by the kit's cost model (lab.report.cost_model): a
published single-GPU throughput and a published cluster in, the step at N workers out,
with every input's source and every assumption printed (`invoke published`).

- horovod-512: Horovod's 512-GPU benchmark (docs/benchmarks.rst), each model's scaling
  efficiency predicted from the TensorFlow benchmarks' single-P100 throughput;
- t4-mnist: a course lab's filled report (Horovod's MNIST example on one server of 4 T4s),
  2-4 GPUs predicted from its 1-GPU figure. That report is not public: the docs cite the
  Horovod comparison only.

The model, the same for both: a worker's step is its 1-GPU step (batch / throughput, one
GPU a worker, so nothing shared) plus the communication exposed after its backward pass
(cost_model.horovod_schedule: Horovod's cycles fusing the gradients as they become ready
and all-reducing them one collective at a time on a Fit whose latency and per-byte cost are
the cluster's, not fitted); the scaling efficiency is the 1-GPU step over that step. Every
constant below was fixed, with its source, before the first prediction was computed; none
is tuned to meet the published figures.

Standard library at import; the gradients come from lab.models.published_gradients' data
file."""
from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass

from lab.models import published_gradients as pg
from lab.report import algorithms
from lab.report import cost_model as cm

MIB = 2**20


class PublishedError(ValueError):
    """A comparison that does not exist, or a cluster that cannot be predicted."""


@dataclass(frozen=True)
class Cluster:
    """A published cluster as the cost model sees it: the ring's slowest hop (its rate and
    what a payload byte costs of it), the latency of each of the ring's steps, and the
    Horovod version's cycle and fusion threshold."""
    servers: int
    gpus_per_server: int
    link_gbits: float           # the ring's slowest hop, Gbit/s
    framing: float              # link bytes per payload byte on that hop
    step_latency_s: float       # each of the ring's 2(n-1) steps
    backend: str                # lab.report.algorithms' back end ("nccl": a ring)
    cycle_s: float              # Horovod's cycle time
    fusion_bytes: float         # Horovod's fusion threshold
    cycle_cost_s: float = 0.0   # what a cycle costs beyond its collectives

    @property
    def workers(self) -> int:
        return self.servers * self.gpus_per_server

    def fit(self) -> cm.Fit:
        """The cost model's collective cost on this cluster, set, not fitted."""
        return cm.Fit(self.step_latency_s, self.framing / (self.link_gbits * 1e9 / 8), 0, 0,
                      "set from the published cluster", backend=self.backend)


# --- Horovod's 512-GPU benchmark ---------------------------------------------------------
HOROVOD_512_SOURCE = ("Horovod docs/benchmarks.rst (v0.28.1, lines 13-14): 128 servers with 4 Pascal GPUs each, "
                      "RoCE-capable 25 Gbit/s network; scaling efficiency 90% Inception V3 and ResNet-101, "
                      "68% VGG-16; tf_cnn_benchmarks with --batch_size 64 (line 35). Chart of 2018-05-10 "
                      "(git 8318a898), when Horovod was v0.12.1-v0.13.0")
HOROVOD_512_EFFICIENCY = {"inception_v3": 0.90, "resnet101": 0.90, "vgg16": 0.68}
P100_SOURCE = ("TensorFlow's Benchmarks page (tensorflow/docs site/en/r1/guide/performance/benchmarks.md, once "
               "www.tensorflow.org/performance/benchmarks), \"Details for NVIDIA DGX-1 (NVIDIA Tesla P100)\", "
               "training synthetic data, 1 GPU, batch 64 per GPU, tf_cnn_benchmarks, May 2017")
P100_IMAGES_S = {"inception_v3": 142.0, "resnet50": 219.0, "resnet152": 91.8, "vgg16": 154.0}
P100_BATCH = 64
HOROVOD_512 = Cluster(
    servers=128, gpus_per_server=4,
    link_gbits=25.0,
    # RoCE v2 over Ethernet with 1024-byte packets (the largest RoCE MTU inside a 1500-byte
    # Ethernet MTU): each carries 82 bytes more on the wire: preamble and gap 20, Ethernet 14
    # and FCS 4, IPv4 20, UDP 8, InfiniBand's BTH 12 and ICRC 4 (IBTA, RoCEv2 Annex A17)
    framing=(1024 + 82) / 1024,
    # NCCL's own cost model of its ring (NCCL v2.5.6-1, src/graph/tuning.cc): on more than one
    # server every one of the 2(n-1) steps takes the network's latency (line 92: hw = NET;
    # line 128: nsteps x lat), 6.6 us for the ring's Simple protocol (line 73); its base
    # latency, 8.4 us a collective (line 60), is left out (under 0.2% of 1022 steps)
    step_latency_s=6.6e-6,
    backend="nccl",     # Horovod v0.12.1 calls ncclAllReduce on all ranks (operations.cc 839-864): a ring
    cycle_s=0.005,      # v0.12.1 operations.cc line 1217: the background loop sleeps 5 ms a cycle
    fusion_bytes=64 * MIB,  # v0.12.1 operations.cc line 140: tensor_fusion_threshold 64 MiB
)
HOROVOD_512_ASSUMPTIONS = (
    "Each worker is one P100 as fast as the DGX-1's (the Horovod page says Pascal; which one it does not say).",
    "Batch 64 per GPU for every model (the page's command for ResNet-101; the same for the others).",
    "ResNet-101's single-GPU time per image lies on the line through ResNet-50's and ResNet-152's against "
    "forward FLOPs (the TensorFlow page has no ResNet-101).",
    "The backward is two thirds of the 1-GPU step (twice the forward: cost_model.BACKWARD_SHARE); the "
    "forward, the optimizer and the rest overlap nothing.",
    "A gradient is ready when the backward has done its layer and every layer after it, each layer's "
    "backward in proportion to its forward FLOPs (lab.models.published_gradients, torchvision's models "
    "standing for tf_cnn_benchmarks').",
    "All-reduce is NCCL's ring over all 512 GPUs (Horovod then had no hierarchical all-reduce: it came in "
    "v0.13.6, git dec30c66), its bandwidth that of each server's NIC (each server's ring hops inside the server, "
    "over PCIe or NVLink, are faster), less RoCE v2's framing at 1024-byte packets (8%).",
    "Each ring step costs 6.6 us (NCCL 2.5.6's own model of a ring step across servers).",
    "Horovod's cycle is 5 ms and its fusion threshold 64 MiB (v0.12.1's defaults); a cycle costs "
    "nothing beyond its collectives; collectives run one at a time and do not slow the backward.",
    "No rank waits for another (synthetic data, identical GPUs).",
)


# --- the T4 lab report --------------------------------------------------------------------
T4_SOURCE = ("a course lab's filled report (not public): Horovod's PyTorch MNIST example on one g4dn.12xlarge, "
             "4 x T4 on PCIe, Horovod over MPI (built with HOROVOD_GPU_OPERATIONS=NCCL), CUDA 11.0")
T4_IMAGES_S = {1: 530.97, 2: 882.35, 3: 1084.56, 4: 1226.99}
T4_WALL_S = {1: 113.525, 2: 68.494, 3: 55.322, 4: 48.933}     # the same report's `time` (real)
T4_BATCH = 64           # Horovod v0.19.4 examples/pytorch_mnist.py line 13: --batch-size 64
MNIST_TRAIN_IMAGES = 60000  # MNIST's training set (LeCun, Cortes and Burges)
T4_SERVER = Cluster(
    servers=1, gpus_per_server=4,
    # the ring's hops are PCIe 3.0 x16: 12 GB/s (NCCL's own figure, tuning.cc line 66's comment)
    link_gbits=96.0, framing=1.0,
    step_latency_s=5.7e-6,  # NCCL v2.5.6-1 tuning.cc line 71: a ring step over PCI, Simple protocol
    backend="nccl",
    cycle_s=0.005,      # Horovod v0.19.4 operations.cc line 427: SetCycleTimeMs(5)
    fusion_bytes=64 * MIB,  # v0.19.4 operations.cc line 419: 64 MiB
)
T4_ASSUMPTIONS = (
    "The report's images/s is the training throughput: the 1-GPU step is 64 images / 530.97 images/s.",
    "Batch 64 per GPU (the example's default); the model is the kit's MNIST CNN, the example's.",
    "The backward is two thirds of the step; a gradient is ready when the backward has done its layer and "
    "every layer after it (forward FLOPs).",
    "All-reduce is NCCL's ring over PCIe 3.0 x16 (12 GB/s, 5.7 us a step); Horovod 0.19.4's 5 ms cycle and "
    "64 MiB fusion; a cycle costs nothing beyond its collectives.",
    "The GPUs do not slow each other (one GPU a rank) and no rank waits for another.",
)


def resnet101_images_s() -> float:
    """ResNet-101's single-P100 throughput: the time per image on the line through ResNet-50's
    and ResNet-152's against forward FLOPs (HOROVOD_512_ASSUMPTIONS)."""
    f = {m: pg.load(m).forward_flops for m in ("resnet50", "resnet101", "resnet152")}
    t50, t152 = 1 / P100_IMAGES_S["resnet50"], 1 / P100_IMAGES_S["resnet152"]
    return 1 / (t50 + (f["resnet101"] - f["resnet50"]) / (f["resnet152"] - f["resnet50"]) * (t152 - t50))


def single_gpu_images_s(model: str) -> float:
    return resnet101_images_s() if model == "resnet101" else P100_IMAGES_S[model]


def predict(grads: pg.Gradients, step_s: float, cluster: Cluster, workers: int | None = None,
            ready_by_bytes: bool = False) -> dict:
    """The step at `workers` (the cluster's, by default) from the 1-GPU step `step_s`, and
    what each term of the communication adds to it: the step without the ring's latency,
    without its per-byte cost, and without Horovod's cycle wait (the largest saving is the
    dominant term). `ready_by_bytes`: the gradients ready in proportion to their bytes (the
    cost model's default where a record holds no ready times) instead of the backward's FLOPs."""
    n = workers or cluster.workers
    if n < 1:
        raise PublishedError(f"{n} workers: give 1 or more")
    backward = cm.BACKWARD_SHARE * step_s
    fit = cluster.fit()

    def exposed(f: cm.Fit, cycle_s: float) -> dict:
        return cm.horovod_schedule(grads.total_bytes, 1.0, backward, f, "allreduce", n, grads.tensors,
                                   cycle_s, cluster.fusion_bytes, cluster.cycle_cost_s,
                                   tensor_bytes=grads.model_order_bytes(),
                                   ready_share=None if ready_by_bytes else grads.model_order_ready())

    full = exposed(fit, cluster.cycle_s)
    terms = {"ring latency": exposed(dataclasses.replace(fit, alpha_s=0.0), cluster.cycle_s),
             "bytes on the link": exposed(dataclasses.replace(fit, beta_s_per_byte=0.0), cluster.cycle_s),
             "Horovod's cycle": exposed(fit, 0.0)}
    saved = {k: full["exposed_s"] - v["exposed_s"] for k, v in terms.items()}
    step = step_s + full["exposed_s"] if n > 1 else step_s
    return {"workers": n, "step_one_s": step_s, "step_s": step, "exposed_s": full["exposed_s"] if n > 1 else 0.0,
            "collectives": full["collectives"], "collective_s": full["collective_s"],
            "efficiency": step_s / step, "speedup": n * step_s / step, "saved_s": saved,
            "dominant": max(saved, key=saved.get) if n > 1 else None}


def horovod_512(cluster: Cluster = HOROVOD_512) -> list[dict]:
    """Each model of Horovod's benchmark: predicted and published efficiency at the cluster's workers."""
    rows = []
    for model, published in HOROVOD_512_EFFICIENCY.items():
        images_s = single_gpu_images_s(model)
        p = predict(pg.load(model), P100_BATCH / images_s, cluster)
        by_bytes = predict(pg.load(model), P100_BATCH / images_s, cluster, ready_by_bytes=True)
        rows.append({"model": model, "images_s_one": images_s, "published": published, **p,
                     "error_points": 100 * (p["efficiency"] - published),
                     "efficiency_ready_by_bytes": by_bytes["efficiency"]})
    return rows


def t4_mnist(cluster: Cluster = T4_SERVER) -> dict:
    """2-4 GPUs of the T4 report predicted from its 1-GPU figure, and what the error comes from:
    its images/s are the training set over the whole run's wall time (start-up included), and
    the 1- and 2-GPU wall times give the run's serial part (Amdahl: T(N) = serial + rest / N)."""
    grads = pg.load("mnist")
    step_one = T4_BATCH / T4_IMAGES_S[1]
    rows = []
    for n, published in T4_IMAGES_S.items():
        p = predict(grads, step_one, dataclasses.replace(cluster, gpus_per_server=n))
        predicted = T4_IMAGES_S[1] * p["speedup"]
        rows.append({"workers": n, "published": published, "predicted": predicted,
                     "error": predicted / published - 1, **{k: p[k] for k in ("exposed_s", "dominant", "saved_s")}})
    wall = {n: MNIST_TRAIN_IMAGES / v for n, v in T4_IMAGES_S.items()}
    serial = 2 * T4_WALL_S[2] - T4_WALL_S[1]
    return {"rows": rows, "implied_wall_s": wall,
            "wall_ratio": {n: wall[n] / T4_WALL_S[n] for n in T4_WALL_S},
            "serial_s": serial, "serial_share": serial / T4_WALL_S[1],
            "median_abs_error": statistics.median(abs(r["error"]) for r in rows if r["workers"] > 1)}


COMPARISONS = ("horovod-512", "t4-mnist")


def render(which: str = "all", link_gbits: float | None = None) -> str:
    """The comparisons' text: sources, assumptions, then predicted against published.
    `link_gbits`: the Horovod cluster's network at another rate (a what-if: the published
    figures then only show what the published link gave)."""
    chosen = list(COMPARISONS) if which in ("", "all") else [which]
    if chosen[0] not in COMPARISONS:
        raise PublishedError(f"no comparison {which!r}: choose all or one of {', '.join(COMPARISONS)}")
    if link_gbits is not None and not link_gbits > 0:
        raise PublishedError(f"--link-gbits {link_gbits:g}: give the network's rate in Gbit/s, above 0")
    out = []
    if "horovod-512" in chosen:
        cluster = HOROVOD_512 if link_gbits is None else dataclasses.replace(HOROVOD_512, link_gbits=link_gbits)
        out += _render_horovod(cluster)
    if "t4-mnist" in chosen:
        out += ([""] if out else []) + _render_t4()
    return "\n".join(out)


def _assumptions(items) -> list[str]:
    return [f"  {k}. {a}" for k, a in enumerate(items, 1)]


def _render_horovod(c: Cluster = HOROVOD_512) -> list[str]:
    what_if = c.link_gbits != HOROVOD_512.link_gbits
    out = ["Horovod's 512-GPU benchmark, predicted" + (
               f" on {c.link_gbits:g} Gbit/s instead of the published {HOROVOD_512.link_gbits:g} (a what-if: "
               "the published figures are for the published link)" if what_if else ""),
           f"  published: {HOROVOD_512_SOURCE}",
           f"  single GPU: {P100_SOURCE}: " + ", ".join(f"{m} {v:g}" for m, v in P100_IMAGES_S.items())
           + f" images/s; ResNet-101 {resnet101_images_s():.1f} (assumption 3)",
           f"  gradients: {pg.DATA_FILE.name} (" + ", ".join(
               f"{m} {pg.load(m).total_bytes / 1e6:.1f} MB in {pg.load(m).tensors} tensors"
               for m in HOROVOD_512_EFFICIENCY) + ")",
           f"  cluster: {c.workers} workers, {c.servers} servers x {c.gpus_per_server}; ring of "
           f"{algorithms.steps('allreduce', c.workers, c.backend)} steps x {c.step_latency_s * 1e6:g} us, "
           f"{c.link_gbits:g} Gbit/s x {1 / c.framing:.3f} payload; cycle {c.cycle_s * 1e3:g} ms, fusion "
           f"{c.fusion_bytes / MIB:g} MiB",
           "  assumptions (fixed before the prediction):", *_assumptions(HOROVOD_512_ASSUMPTIONS),
           "",
           f"  {'model':13} {'1-GPU step':>10} {'exposed':>9} {'collectives':>11} {'predicted':>9} "
           f"{'published':>9} {'error':>7}  dominant term (what removing it saves)"]
    rows = horovod_512(c)
    for r in rows:
        saved = ", ".join(f"{k} {round(v * 1e3)} ms" for k, v in r["saved_s"].items())
        out.append(f"  {r['model']:13} {r['step_one_s'] * 1e3:8.0f} ms {r['exposed_s'] * 1e3:6.0f} ms "
                   f"{r['collectives']:>11} {100 * r['efficiency']:8.0f}% {100 * r['published']:8.0f}% "
                   f"{r['error_points']:+6.0f} pt  {r['dominant']} ({saved})")
    out += ["", "  not modelled, so not in the prediction: Horovod's coordination of 512 ranks each cycle, "
            "stragglers, TensorFlow's own overheads beyond the 1-GPU step; a negative saving: without the "
            "term the collectives fuse less and cost more",
            "  with the gradients ready in proportion to their bytes instead (the cost model's default where a "
            "record holds no ready times): " + ", ".join(
                f"{r['model']} {100 * r['efficiency_ready_by_bytes']:.0f}%" for r in rows)]
    return out


def _render_t4() -> list[str]:
    t = t4_mnist()
    c = T4_SERVER
    out = ["A 4 x T4 server's MNIST report, predicted from its 1-GPU figure",
           f"  published: {T4_SOURCE}: " + ", ".join(f"{v:,.2f}" for v in T4_IMAGES_S.values())
           + " images/s at 1-4 GPUs",
           f"  gradients: {pg.DATA_FILE.name} (mnist {pg.load('mnist').total_bytes:,} bytes in "
           f"{pg.load('mnist').tensors} tensors)",
           f"  server: ring over PCIe, {c.step_latency_s * 1e6:g} us a step, {c.link_gbits / 8:g} GB/s; cycle "
           f"{c.cycle_s * 1e3:g} ms, fusion {c.fusion_bytes / MIB:g} MiB",
           "  assumptions (fixed before the prediction):", *_assumptions(T4_ASSUMPTIONS),
           "",
           f"  {'GPUs':>4} {'predicted':>10} {'published':>10} {'error':>7} {'exposed':>8}  dominant term of the model"]
    for r in t["rows"]:
        out.append(f"  {r['workers']:>4} {r['predicted']:>10,.0f} {r['published']:>10,.0f} {100 * r['error']:+6.0f}% "
                   f"{r['exposed_s'] * 1e3:5.1f} ms  {r['dominant'] or '-'}")
    ratios = ", ".join(f"{v:.3f}" for v in t["wall_ratio"].values())
    out += ["",
            f"  median error at 2-4 GPUs: {100 * t['median_abs_error']:.0f}%. What it comes from: the report's "
            f"images/s are {MNIST_TRAIN_IMAGES:,} images over each run's whole wall time (60,000 / images/s over "
            f"its `time` real: {ratios}), start-up and evaluation included, which no term of a step holds; "
            f"its 1- and 2-GPU wall times put the serial part at 2 x T(2) - T(1) = {t['serial_s']:.1f} s, "
            f"{100 * t['serial_share']:.0f}% of the 1-GPU run (Amdahl), the error's dominant term."]
    return out
