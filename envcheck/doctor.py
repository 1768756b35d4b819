"""`invoke doctor`: the host's probes here, the stack's probes where the ranks run (in
the lab image, started with the options `bench` uses, or as local processes), then the
contradictions between the two. Returns plain dicts for rendering."""
from __future__ import annotations

import json
import tempfile
import time

from envcheck import findings, host, stack
from envcheck.probes import FAIL, PASS, Result


def _dicts(results: list[Result], where: str) -> list[dict]:
    return [dict(r.as_dict(), where=where) for r in results]


def _results(dicts: list[dict]) -> dict:
    return {d["name"]: Result(d["name"], d["status"], d["value"], d["fix"]) for d in dicts}


def stack_in_image(runner, np: int) -> list[dict]:
    """Run `python -m envcheck --part stack` in the image; its checks, or one FAIL."""
    from lab.container import ContainerError
    cmd = ["python", "-m", "envcheck", "--part", "stack", "--np", str(np), "--json"]
    try:
        rc, out = runner.output(cmd, timeout_s=600)
    except ContainerError as e:
        return [dict(Result("stack in the image", FAIL, None, str(e)).as_dict(), where="image")]
    for line in reversed(out.splitlines()):
        if line.startswith("{") and '"checks"' in line:
            return [dict(c, where="image") for c in json.loads(line)["checks"]]
    tail = (out.strip().splitlines() or ["no output"])[-1]
    return [dict(Result("stack in the image", FAIL, None,
                        f"`python -m envcheck` in {runner.tag} ended with {rc}: {tail}").as_dict(),
                 where="image")]


def choose_runner(where: str, image: str, frozen: bool, gpus: bool, results_dir: str):
    """(runner or None, note): the lab image as bench would use it, else local."""
    if where == "local":
        return None, None
    from lab import container
    try:
        client = container.connect()
    except container.ContainerError as e:
        if where == "image" or image:
            raise
        return None, f"the stack is checked as local processes: {e}"
    tags = [image] if image else container.candidate_images("cuda" if gpus else "cpu", "horovod", "gloo")
    img = container.find_image(client, tags)
    if img is None:
        if where == "image" or image:
            raise container.ContainerError(f"no image {' or '.join(tags)} is built: run `invoke build`")
        return None, f"the stack is checked as local processes: no lab image ({', '.join(tags)}) is built"
    runner = container.ImageRunner(client, img, frozen=frozen, gpus=gpus,
                                   results_dir=results_dir, data_dir=None)
    return runner, f"the stack is checked in the image {runner.tag} ({img.short_id})"


def run(np: int = 2, where: str = "auto", image: str = "", frozen: bool = False,
        echo=print) -> tuple[list[dict], float, list[str]]:
    t0 = time.monotonic()
    notes = []
    host_results = host.collect()
    checks = _dicts(host_results, "host")
    host_by_name = {r.name: r for r in host_results}
    gpus = bool((host_by_name["gpus"].value or {}).get("count")) if host_by_name["gpus"].status == PASS else False
    with tempfile.TemporaryDirectory(prefix="lab-doctor-") as scratch:
        runner, note = choose_runner(where, image, frozen, gpus, scratch)
        if note:
            notes.append(note)
            echo(note)
        if runner is None:
            ranks = _dicts(stack.collect(np), "local")
        else:
            ranks = stack_in_image(runner, np)
    checks += ranks
    found = findings.find(host_by_name, _results(ranks), np, in_image=runner is not None)
    checks += _dicts(found, "both")
    return checks, time.monotonic() - t0, notes
