"""`invoke doctor`: the host's probes here, the stack's probes where the ranks run (in
the lab image, chosen and started as `bench` does, or as local processes), then the
contradictions between the two (envcheck's probes and findings). Returns plain dicts
for rendering (envcheck.report)."""
from __future__ import annotations

import json
import tempfile
import time

from envcheck import findings, host, stack
from envcheck.probes import FAIL, PASS, Result
from lab.common import kit
from lab.host.places import choose_runner, hold
from lab.host.places.base import RunnerError


def _dicts(results: list[Result], where: str) -> list[dict]:
    return [dict(r.as_dict(), where=where) for r in results]


def _results(dicts: list[dict]) -> dict:
    return {d["name"]: Result(d["name"], d["status"], d["value"], d["fix"]) for d in dicts}


def with_link_reference(ranks: list[dict], topology: Result | None) -> None:
    """The GPU collectives' second reference: the host's GPU links (NVLink or PCIe, from
    NVML: envcheck.gpu.interconnect_reference), beside the GPU memory copy they carry."""
    reference = (topology.value or {}).get("reference") if topology and topology.status == PASS else None
    if not reference:
        return
    for c in ranks:
        if c["name"].startswith("collectives") and isinstance(c["value"], dict) \
                and c["value"].get("backend") == "nccl":
            c["value"] = dict(c["value"], link=reference)


ACROSS_SIZES = (65536, 1048576, 16777216)    # 64 KiB, 1 MiB, 16 MiB: a link's rate shows by 16 MiB
ACROSS_TIMEOUT_S = 600
ACROSS_OP_S = 0.5       # the largest size a slow shaped link gets: about this long an operation


def across_sizes(link_gbs: float | None) -> list[int]:
    """The sweep's sizes on a link of `link_gbs`: those an all-reduce of two ranks moves
    in about ACROSS_OP_S (each rank sends its whole buffer once), so that 13 runs of each
    of six collectives stay minutes on a slow link (10 Mbit/s: 16 MiB would take 13 s an
    operation, 17 min in all)."""
    if not link_gbs:
        return list(ACROSS_SIZES)
    fits = [b for b in ACROSS_SIZES if b / (link_gbs * 1e9) <= ACROSS_OP_S]
    return fits or [4096]


def check_across(nodes: int, link: str, frozen: bool = False):
    """The cluster's runner on `nodes` nodes for `--nodes`/`--link`, checked before any
    probe runs: its nodes up and the link spec one the place can shape (RunnerError, one
    sentence). across_nodes runs on it: the checkout's envcheck (compose.yaml mounts it),
    or with `frozen` the image's own copy, as bench --frozen runs there."""
    runner, _ = choose_runner(nodes=nodes, frozen=frozen)
    runner.check_link(link)
    return runner


def across_nodes(runner, link: str = "", echo=print) -> dict:
    """_across_nodes' row, with the seconds it took (as each probe's)."""
    import time
    t0 = time.monotonic()
    # one run at a time on the nodes: a bench beside it would slow its collectives, and it
    # the bench's steps (lab.host.places.hold)
    with hold.hold(runner.holds, "doctor", what="doctor's collectives", place=runner.kind,
                   echo=echo, clear=runner.stop, hint=""):
        row = _across_nodes(runner, link, echo)
    return dict(row, seconds=round(time.monotonic() - t0, 2))


def _across_nodes(runner, link: str = "", echo=print) -> dict:
    """The collectives (lab.common.collectives.OPS) over Gloo with one rank on each of the
    cluster's nodes (`runner`: check_across's; envcheck.collectives under
    torch.distributed.run on every node), the links shaped by `link` while they run: a
    check row whose value carries two references, rank 0's node's memory copy and the
    shaped link's rate (none when unshaped: a veth pair has none)."""
    import uuid

    row = {"where": f"cluster ({runner.nodes} nodes)", "name": "collectives_across"}
    lines: list[str] = []
    try:
        reference = runner.link_reference(link)
        sizes = across_sizes(reference["gbs"] if reference else None)
        commands = runner.module_commands("envcheck.collectives", [
            "--backend", "gloo", "--sizes", ",".join(map(str, sizes))], f"doctor-{uuid.uuid4().hex[:8]}")
        try:        # inside: nodes given cores or shaped before one that fails are given back
            runner.own_cores(echo)      # as bench's runs across the nodes have them
            if link:
                runner.shape_links(link, echo)
            res = runner.run(commands, {"OMP_NUM_THREADS": "1"}, ACROSS_TIMEOUT_S, lines.append)
        finally:
            runner.share_cores()        # never raises
            if link:
                runner.unshape_links()
    except RunnerError as e:
        return dict(row, status=FAIL, value=None, fix=str(e))
    found = [ln[ln.index("{"):] for ln in lines if '{"backend"' in ln]
    if res.returncode != 0 or not found:
        tail = " | ".join(lines[-3:]) or res.why
        return dict(row, status=FAIL, value=None,
                    fix=f"the collectives across the nodes did not finish ({res.why}): {tail}")
    value = json.loads(found[-1])
    if reference:
        value["link"] = reference
    return dict(row, status=PASS, value=value, fix="")


def stack_in_image(runner, np: int) -> list[dict]:
    """Run `python -m envcheck --part stack` where the runner's ranks run; its checks,
    or one FAIL."""
    cmd = [runner.python, "-m", "envcheck", "--part", "stack", "--np", str(np), "--json"]
    try:
        rc, out = runner.output(cmd, timeout_s=600)
    except RunnerError as e:
        return [dict(Result("stack in the image", FAIL, None, str(e)).as_dict(), where="image")]
    for line in reversed(out.splitlines()):
        if line.startswith("{") and '"checks"' in line:
            return [dict(c, where="image") for c in json.loads(line)["checks"]]
    tail = (out.strip().splitlines() or ["no output"])[-1]
    return [dict(Result("stack in the image", FAIL, None,
                        f"`python -m envcheck` in {runner.tag} ended with {rc}: {tail}").as_dict(),
                 where="image")]


def _where_checked(where: str, image: str, frozen: bool, gpus: bool, scratch: str, echo):
    """[(runner, note)]: where the stack is checked, chosen as bench chooses. With GPUs and
    no image named, one runner per kind of GPU image that is built: Horovod's GPU data
    path is fixed when it is built (HOROVOD_GPU_OPERATIONS, docker/install-horovod.sh), so
    a gpu-nccl image says nothing of a gpu-mpi one's CUDA-aware MPI, and the reverse.
    bench asks for the image by back end (lab.host.images.choice.candidate_images: nccl gives gpu-nccl*,
    mpi gpu-mpi*); doctor asks for both and checks each one found."""
    def choose(backend):
        return choose_runner(where=where, image=image, frozen=frozen,
                             device="cuda" if gpus else "cpu", framework="horovod",
                             backend=backend, results_dir=scratch, data_dir=None,
                             check_gpu_code=False, echo=echo)
    if not gpus or image or where == "local":
        return [choose("gloo")]
    found, first_error, fallback = [], None, None
    for backend in ("nccl", "mpi"):
        try:
            runner, note = choose(backend)
        except RunnerError as e:
            first_error = first_error or e
            continue
        if not runner.in_container:
            fallback = fallback or (runner, note)
        elif all(r.image.id != runner.image.id for r, _ in found):
            found.append((runner, note))
    if found:
        return found
    if fallback:
        return [fallback]
    raise first_error


def run(np: int = 2, where: str = "auto", image: str = "", frozen: bool = False,
        echo=print, cluster=None, link: str = "") -> tuple[list[dict], float, list[str]]:
    """Doctor's checks: the host, the ranks' stack where they run (`where`), what the two
    say together, and with `cluster` (check_across's runner) the collectives across its
    nodes over `link`."""
    t0 = time.monotonic()
    notes = []
    host_results = host.collect()
    checks = _dicts(host_results, "host")
    host_by_name = {r.name: r for r in host_results}
    gpus = bool((host_by_name["gpus"].value or {}).get("count")) if host_by_name["gpus"].status == PASS else False
    with tempfile.TemporaryDirectory(prefix="lab-doctor-") as scratch:
        chosen = _where_checked(where, image, frozen, gpus, scratch, echo)
        several = len(chosen) > 1
        for runner, note in chosen:
            if runner.in_container:
                note = f"the stack is checked in the image {runner.tag} ({runner.image.short_id})"
            elif note:
                note = note.replace("running as local processes", "the stack is checked as local processes")
            if note:
                notes.append(note)
                echo(note)
            # Two images checked: each one's rows name it.
            suffix = f" {runner.tag}" if several else ""
            if not runner.in_container:
                ranks = _dicts(stack.collect(np), "local")
            else:
                ranks = [dict(c, where=c["where"] + suffix) for c in stack_in_image(runner, np)]
            with_link_reference(ranks, host_by_name.get("gpu_topology"))
            checks += ranks
            visible = None
            if runner.in_container and gpus:
                ids = runner.spec(["true"]).gpu_ids       # the host's CUDA_VISIBLE_DEVICES, if set
                visible = len(ids) if ids else None
            found = findings.find(host_by_name, _results(ranks), np, in_image=runner.in_container,
                                  visible=visible, cores=kit.cores())   # an image here: this machine's
            checks += _dicts(found, "both" + suffix)
    if cluster is not None:
        checks.append(across_nodes(cluster, link, echo))
    return checks, time.monotonic() - t0, notes
