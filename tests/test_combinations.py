"""The combination test: a pairwise set of cases over the values of every option that
changes what the ranks do (lab.common.options.CROSSED: the table's choices, and the
representative numbers its rows give), so that every pair of values appears in a case.

Each pair is judged by the host's own checks before any rank starts, in process
(`verdict`: the plan, the place, the request against the ranks' stack, the process
counts, the steps), with every other option at its default:
- a pair those checks accept is covered by a case that really runs (real launchers and
  ranks, one sweep over all of them: one runner, one stack probe), and ends ok with a
  finite loss, on the digits lower over its last 3 steps than over its first 3, in a
  record whose labels say what ran;
- a pair they refuse is refused for itself alone, in one sentence naming both options;
- a value the CPU cannot run at all is out of this test's reach (OUT_OF_REACH).
A new option (with choices, or `crossed` numbers) or a new value joins by itself."""
from __future__ import annotations

import dataclasses
import math
import time

import pytest

from lab.common import options, results
from lab.common.config import NO_AUTOCAST, ConfigError, RunConfig
from lab.host.errors import BenchError, RunnerError
from lab.host.places import for_request
from lab.host.request.checks import check_request, refused_counts
from lab.host.request.plan import Job, Plan, plan_of
from lab.host.run import bench, sweep
from lab.host.settings import BenchSettings
from lab.models.lstm import net as lstm_net
from tests import pairwise
from tests.conftest import requires_horovod, requires_mpirun

FACTORS = dict(options.CROSSED)
DEFAULTS = {f: options.BY_NAME[f].value for f in FACTORS}     # framework: auto
# What a CPU-only CI cannot reach, and why: each value is refused alone here (checked
# below), but MNIST, which is a download (CI has no network: the digits stand in).
OUT_OF_REACH = {
    ("backend", "nccl"): "NCCL runs on GPUs only",
    ("device", "cuda"): "no GPU",
    ("precision", "tf32"): "TF32 is a mode of NVIDIA's tensor cores",
    ("precision", "fp16"): "fp16 autocast and its gradient scaler are the GPU's",
    ("strategy", "dataparallel"): "nn.DataParallel spreads one process over GPUs",
    ("data", "mnist"): "a download, and CI has no network (the digits are the offline stand-in)",
}
NOT_CHECKED = {("data", "mnist")}       # judging it would fetch MNIST
# Runs short enough for CI: the digits long enough for the loss to fall (about 40 steps),
# synthetic data a few steps; ResNet-50 a few steps whatever its data (a step of it at
# 224x224 takes seconds on a CPU core).
DIGITS_STEPS, SYNTHETIC_STEPS, HEAVY_STEPS, WARMUP = 40, 6, 3, 1
# ResNet-50 is crossed with its input alone (a launch of it costs many of the CNN's): the
# digits and its own synthetic 224x224 images, in one process at the smallest batch in
# fp32 (affordable); its strategies are tests/test_strategies.py's; ResNet-50 in bf16 is
# not crossed here (the MNIST CNN and the LSTM carry bf16's pairs).
HEAVY = {"resnet50", "vgg16"}
HEAVY_CROSSED = ("data", "device")
# A heavy model's input not crossed here, and why (tests/test_strategies.py runs it).
TOO_SLOW = {(("data", "synthetic"), ("model", "vgg16")):
            "VGG-16 on its own 224x224 input: 15.47 GFLOPS a forward per image against "
            "ResNet-50's 4.089 (torchvision's VGG16_Weights and ResNet50_Weights meta, _ops)"}
# Models whose loss does not fall within a short run, and why: the fall is asked of the others.
NO_FALL = {("model", "resnet50"): "ResNet-50 from scratch: its first steps' loss rises (SGD without warm-up)",
           ("model", "vgg16"): "VGG-16 from scratch, no batch norm: 3 steps at chance",
           ("compression", "int8-naive"): "the baseline that fails: every gradient below 1 is sent as 0"}
FORWARD_DTYPE = {"fp32": "float32", "bf16": "bfloat16"}     # what the CPU's precisions run at


def forward_dtype(case: dict) -> str | None:
    """What the case's layers compute in: its precision's, but the LSTM's layers in fp32
    under bf16's autocast on a CPU without oneDNN's bf16 LSTM (lab.models.lstm.net); None (not
    recorded) for the strategies whose schedule runs the forward (NO_AUTOCAST)."""
    if case["strategy"] in NO_AUTOCAST:
        return None
    # DeepSpeed's bf16 is its own mode (the model's weights cast, no autocast: its
    # strategy's autocasts), whose LSTM computes in bf16
    if (case["model"] == "lstm" and case["precision"] == "bf16" and case["strategy"] != "deepspeed"
            and not lstm_net.cpu_has_bf16_lstm()):
        return "float32"
    return FORWARD_DTYPE[case["precision"]]


def nps(values: dict) -> list[int]:
    """Two processes; --framework none runs one."""
    return [1] if values["framework"] == "none" else [2]


def run_length(values: dict) -> dict:
    """epochs, max_steps, warmup_steps: short runs (see DIGITS_STEPS)."""
    if values["model"] in HEAVY:
        return dict(epochs=1, max_steps=HEAVY_STEPS, warmup_steps=WARMUP)
    if values["data"] != "digits":
        return dict(epochs=1, max_steps=SYNTHETIC_STEPS, warmup_steps=WARMUP)
    cfg = RunConfig(data="digits", batch_size=values["batch_size"], strategy=values["strategy"])
    per_epoch = cfg.steps_per_epoch(cfg.train_size(), cfg.data_world(nps(values)[0]))
    return dict(epochs=math.ceil(DIGITS_STEPS / min(per_epoch, DIGITS_STEPS)),
                max_steps=DIGITS_STEPS, warmup_steps=WARMUP)


def settings_of(case: dict, results_dir: str, run_id: str = "combinations") -> BenchSettings:
    """The bench settings of a (partial) case: every factor not in it at its default."""
    values = {**DEFAULTS, **case}
    return BenchSettings(np=nps(values), where="local", results_dir=results_dir, run_id=run_id,
                         timeout_s=600, **values, **run_length(values))


def verdict(case: dict, stack: dict, results_dir: str) -> str | None:
    """The sentence that refuses the case before any rank starts, or None: the checks
    bench makes, in its order (lab.host.run.bench.run and run_jobs)."""
    s = settings_of(case, results_dir)
    try:
        s, _ = for_request(s)
        plan_of(s)
        framework, _ = check_request(s, stack)
        refused = refused_counts(s, stack, framework)
        if refused:
            return refused[s.np[0]]
        bench.check_steps(s, framework, s.np)
    except (BenchError, RunnerError, ConfigError) as e:
        return str(e)
    return None


def cost(case: dict) -> float:
    """A case's rough cost in launches: a heavy model counts as three. (--repeat is not
    crossed: it is bench's interleaving on the host, reach "bench", and changes nothing the
    ranks do; tests/test_sweep.py runs its repeats.)"""
    values = {**DEFAULTS, **case}
    return 1 + 2 * (values["model"] in HEAVY)



@dataclasses.dataclass
class Judged:
    """Every value and pair judged here, and the cases that cover what runs."""
    alone: dict            # (factor, value) -> the sentence refusing it alone, for what is refused
    refused: dict          # pair -> the sentence refusing it (every other option at its default)
    runs: list             # the pairs the checks accept
    cases: list            # the pairwise cases that run
    seconds: float         # how long judging and covering took


def judge(stack: dict, results_dir: str) -> Judged:
    t0 = time.monotonic()
    memo: dict = {}

    def said(case: dict) -> str | None:
        key = tuple(sorted(case.items()))
        if key not in memo:
            memo[key] = verdict(case, stack, results_dir)
        return memo[key]

    alone = {}
    for f, values in FACTORS.items():
        for v in values:
            if (f, v) in NOT_CHECKED:
                alone[(f, v)] = OUT_OF_REACH[(f, v)]
                continue
            line = said({f: v})
            if line:
                alone[(f, v)] = line
    refused, runs = {}, []
    for pair in pairwise.all_pairs(FACTORS):
        if any(p in alone for p in pair):
            continue
        line = said(dict(pair))
        if line:
            refused[pair] = line
        else:
            runs.append(pair)
    cases = pairwise.cover(FACTORS, wanted(runs), lambda case: affordable(case) and said(case) is None,
                           cost)
    return Judged(alone, refused, runs, cases, time.monotonic() - t0)


def wanted(runs: list) -> list:
    """The pairs that run, less a heavy model's with the factors it is not crossed with."""
    def heavy_elsewhere(pair):
        return any(f == "model" and v in HEAVY for f, v in pair) and not any(
            f in HEAVY_CROSSED for f, _ in pair)
    return [p for p in runs if not heavy_elsewhere(p) and tuple(sorted(p)) not in TOO_SLOW]


def affordable(case: dict) -> bool:
    """A heavy model in one process (--framework none) at the smallest batch, in fp32, every
    other factor but its input at its plainest (HEAVY_RUN): 2 ranks of ResNet-50 on its own
    224x224 input took 87 s here, and in bf16 (which this CPU emulates) on the digits 59 s."""
    if case.get("model") not in HEAVY:      # a partial case: what it holds so far
        return True
    if any(tuple(sorted((f, case[f]) for f, _ in pair if f in case)) == pair for pair in TOO_SLOW):
        return False
    return all(case[f] == v for f, v in HEAVY_RUN.items() if f in case)


HEAVY_RUN = {"framework": "none", "backend": "gloo", "strategy": "ddp", "compression": "none",
             "precision": "fp32", "batch_size": min(FACTORS["batch_size"]),
             "checkpoint_every": 0, "max_restarts": 0}


@pytest.fixture(scope="module")
def judged(stack, tmp_path_factory):
    return judge(stack, str(tmp_path_factory.mktemp("judged")))


def flag(f: str) -> str:
    return "--" + options.BY_NAME[f].flag


def one_sentence(line: str) -> bool:
    return "\n" not in line and not any(f"{stop} {c}" in line for stop in ".!?" for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ")


def test_the_generator_covers_every_pair_it_is_asked_for_and_only_accepted_cases():
    factors = {"a": (0, 1, 2), "b": ("x", "y"), "c": (True, False), "d": (5, 6, 7)}
    refused = {(("a", 2), ("b", "y")), (("c", False), ("d", 7))}

    def accepts(case):
        return not any(p in refused for p in pairwise.pairs_of(case, factors))
    wanted = [p for p in pairwise.all_pairs(factors) if p not in refused]
    cases = pairwise.cover(factors, wanted, accepts)
    assert pairwise.check_covers(cases, factors, wanted) == []
    assert all(accepts(c) for c in cases) and all(set(c) == set(factors) for c in cases)
    assert len(cases) < 3 * 2 * 2 * 3 and cases == pairwise.cover(factors, wanted, accepts)
    # what the check finds missing
    assert pairwise.check_covers(cases[1:], factors, wanted) != []
    with pytest.raises(ValueError, match="is accepted beside|no accepted case holds"):
        pairwise.cover(factors, [(("a", 2), ("b", "y"))], accepts)


def test_what_the_cpu_refuses_alone_is_the_out_of_reach_list(judged):
    print("\nout of reach:\n" + "\n".join(f"  --{options.BY_NAME[f].flag} {v}: {why}"
                                           for (f, v), why in OUT_OF_REACH.items()))
    assert set(judged.alone) == set(OUT_OF_REACH)
    for (f, v), line in judged.alone.items():
        if (f, v) not in NOT_CHECKED:
            assert flag(f) in line and one_sentence(line), line


def test_every_refused_pair_is_refused_for_itself_in_one_sentence_naming_both(judged):
    print(f"\n{len(judged.refused)} refused pairs:")
    for ((f, a), (g, b)), line in judged.refused.items():
        print(f"  {flag(f)} {a} with {flag(g)} {b}: {line}")
    assert judged.refused
    bad = [(pair, line) for pair, line in judged.refused.items()
           if not (flag(pair[0][0]) in line and flag(pair[1][0]) in line and one_sentence(line))]
    assert bad == []


def test_the_cases_cover_every_pair_that_runs(judged):
    print(f"\n{len(judged.cases)} cases cover "
          f"{len(wanted(judged.runs))} pairs, judged in {judged.seconds:.1f} s")
    assert pairwise.check_covers(judged.cases, FACTORS, wanted(judged.runs)) == []
    left = [p for p in judged.runs if p not in wanted(judged.runs)]
    assert all(any(f == "model" and v in HEAVY for f, v in p) for p in left)


def mean(xs):
    return sum(xs) / len(xs)


@pytest.mark.slow
@requires_horovod
@requires_mpirun
def test_every_case_runs_with_the_labels_of_what_ran_and_a_finite_loss(judged, tmp_path):
    t0 = time.monotonic()
    combos = tuple(settings_of(c, str(tmp_path)) for c in judged.cases)
    jobs = tuple(Job(s, i, s.np[0], 0) for i, s in enumerate(combos))
    lines: list[str] = []
    sweep.run_sweep(Plan(combos, jobs), echo=lines.append)
    rfile = results.run_dir(str(tmp_path), combos[0].run_id) / results.RESULTS_FILE
    records = results.read_records(rfile)[0]
    print(f"\n{len(judged.cases)} cases, {len(jobs)} launches in {time.monotonic() - t0:.0f} s")
    assert len(records) == len(jobs), "\n".join(lines[-30:])
    wrong = []
    for job, r in zip(jobs, records):
        case = judged.cases[job.combination]
        problems = check_record(case, r)
        if problems:
            wrong.append(f"{case}: {'; '.join(problems)}")
    assert wrong == [], "\n".join(wrong)


def check_record(case: dict, r: dict) -> list[str]:
    """What in a case's record differs from what it asked for, or is not a finite loss."""
    if r.get("status") != "ok":
        return [f"status {r.get('status')}: {r.get('error') or r.get('reason')}"]
    c, f, out = r["config"], r["figures"], []
    for k in ("precision", "compression", "strategy", "framework", "backend", "model", "data",
              "batch_size", "checkpoint_every"):
        if c[k] != case[k]:
            out.append(f"config.{k} {c[k]!r}")
    controller = case["backend"] if case["framework"] != "none" else "none"
    if r["world"]["controller"] != controller:
        out.append(f"world.controller {r['world']['controller']!r}, not {controller!r}")
    if f["forward_dtype"] != forward_dtype(case):
        out.append(f"figures.forward_dtype {f['forward_dtype']!r}, not {forward_dtype(case)!r}")
    ends = f.get("step_losses") or {}
    losses = [f["final_loss"], *ends.get("first", []), *ends.get("last", [])]
    if len(losses) < 3 or not all(math.isfinite(x) for x in losses):
        out.append(f"losses {losses}")
    elif case["data"] == "digits" and not any(p in NO_FALL for p in case.items()) \
            and not mean(ends["last"]) < mean(ends["first"]):
        out.append(f"the loss did not fall: first {ends['first']}, last {ends['last']}")
    return out
