"""What a stalled job's record says (lab.host.watch.stall finds the stall): which rank is the
culprit, which ones only wait for it, where each one is, and, in a rendezvous, what it
waited for and the fix to try.

The culprit is the rank that is NOT in the collective. In order:
1. not answering: a rank whose heartbeat exists (and is not done or failed) but whose
   process on this machine was stopped (/proc/<pid>/stat state T or t) when the stall
   was seen, or that gave no stack within the watch's dump wait (its process a zombie,
   dead or gone, or on another machine). Its own
   watchdog cannot run (SIGSTOP stops every thread), which is itself the signal; the
   ranks that answered are waiting for it.
2. otherwise, ranks whose stack shows them inside a collective or a communication wait
   (a frame named backward, synchronize, allreduce, barrier, ...: COMM_FRAMES) are
   waiting; the ranks that are not are the culprits.
3. only when neither rule singles out some ranks (all or none answer; all or none
   wait): the ranks behind by progress (the heartbeat's sequence, lower than the
   furthest rank's)."""
from __future__ import annotations

import socket

from lab.common import heartbeat

TOP_FRAMES = 4
# Function names of the frames a rank waits in while its peers are expected: autograd's
# backward (DDP's all-reduce buckets are waited for at its end), Horovod's synchronize
# and its mpi_ops, torch.distributed's collectives and a Work's wait.
COMM_FRAMES = frozenset((
    "backward", "_engine_run_backward", "synchronize", "allreduce", "allreduce_", "_allreduce",
    "all_reduce", "allgather", "all_gather", "allgather_object", "all_gather_object",
    "broadcast", "broadcast_object", "broadcast_parameters", "broadcast_object_list",
    "barrier", "wait", "reduce_scatter", "all_to_all", "recv", "send"))
GONE_STATES = {"T": "stopped", "t": "stopped (traced)", "Z": "a zombie", "X": "dead"}


def process_state(beat: dict) -> str | None:
    """What /proc says of a rank's process on this machine: None where it runs or sleeps
    (or is on another machine), else why it cannot answer ("stopped", "gone", ...)."""
    if beat.get("host") != socket.gethostname() or not beat.get("pid"):
        return None
    try:
        with open(f"/proc/{beat['pid']}/stat") as f:
            stat = f.read()
    except OSError:
        return "gone"
    state = stat.rsplit(")", 1)[-1].split()[0] if ")" in stat else ""
    return GONE_STATES.get(state)


def in_collective(stack: list[str]) -> bool:
    """Whether a stack (most recent first, "file.py:LINE in name") waits in communication."""
    return any(frame.rpartition(" in ")[2] in COMM_FRAMES for frame in stack)


def culprits(beats: dict[int, dict | None], dumped: set[int]) -> tuple[list[int], dict[int, str], str]:
    """(the ranks singled out as the cause, rank -> why it is not answering, the rule
    that singled them out: "not answering", "not in a collective" or "behind")."""
    live = {r: b for r, b in beats.items() if b and b.get("phase") not in ("done", "failed")}
    silent: dict[int, str] = {}
    for r, b in live.items():
        state = b.get("process")        # as /proc said when the stall was seen (collect)
        if state in ("stopped", "stopped (traced)") or (state and r not in dumped):
            silent[r] = f"its process is {state}"
        elif r not in dumped:
            silent[r] = "it wrote no stack (its own watchdog did not run)"
    if silent and len(silent) < len(live):
        return sorted(silent), silent, "not answering"
    waiting = {r for r, b in live.items() if in_collective(b.get("stack") or [])}
    if waiting and len(waiting) < len(live):
        return sorted(r for r in live if r not in waiting), silent, "not in a collective"
    top = max((b["seq"] for b in beats.values() if b), default=0)
    behind = [r for r, b in beats.items() if not b or b["seq"] < top] or list(beats)
    return behind, silent, "behind"


def diagnose(beats: dict[int, dict | None], bound: float, np: int, silence_s: float,
             heard_only: bool = False, horovod: dict | None = None,
             flight_dumps: list[str] | None = None, dumped: set[int] | None = None) -> dict:
    """The failed record's error: reason (one line), rank and host (the first culprit),
    and `stalled` with every rank's place and stack. `heard_only`: heartbeats come over
    an API's log of some ranks' output, and a rank never heard is not judged (its output
    may not reach this machine). `dumped`: the ranks whose stack arrived."""
    dumped = {r for r, b in beats.items() if b and b.get("stack")} if dumped is None else dumped
    judged = {r: b for r, b in beats.items() if b or not heard_only} or beats
    behind, silent, rule = culprits(judged, dumped)
    ranks = []
    for r, b in beats.items():
        b = b or {}
        ranks.append({"rank": r, "host": b.get("host"), "behind": r in behind,
                      "answering": r not in silent, "phase": b.get("phase", "not started"),
                      "step": b.get("step"), "where": b.get("where"), "stack": b.get("stack", [])[:12]})
    parts = []
    for e in ranks:
        if not e["behind"]:
            continue
        frames = " < ".join(e["stack"][:TOP_FRAMES]) or "no stack"
        host = f" on {e['host']}" if e["host"] else ""
        why = f"not answering ({silent[e['rank']]}); " if e["rank"] in silent else ""
        parts.append(f"rank {e['rank']}{host} at {heartbeat.describe(beats[e['rank']])}; "
                     f"{why}top frames: {frames}")
    ahead = [e for e in ranks if not e["behind"] and (beats[e["rank"]] or not heard_only)]
    waits = ("; waiting for it: " + ", ".join(
        f"rank {e['rank']} at {heartbeat.describe(beats[e['rank']])}" for e in ahead)) if ahead else ""
    label = {"not answering": "not answering", "not in a collective": "not in the collective",
             "behind": "behind"}[rule]
    reason = f"stalled: no rank advanced for {bound:g} s; {label}: {' | '.join(parts)}{waits}"
    slow = slow_step(beats, behind, bound, silence_s) or in_checkpoint(beats, behind, bound)
    if slow:
        reason += f"; {slow}"
    stalled = {"bound_s": bound, "behind": behind, "rule": rule, "ranks": ranks,
               "waiting": [e["rank"] for e in ahead]}
    rdv = rendezvous(beats, behind, np)
    if rdv:
        stalled["rendezvous"] = rdv
        reason += f"; {rdv['explanation']}"
    if flight_dumps:
        stalled["flight_recorder"] = flight_dumps
    if horovod:
        stalled["horovod"] = horovod
        missing = ", ".join(f"rank {r}: {', '.join(t)}" for r, t in horovod["missing"].items())
        reason += (f"; Horovod's stall check: tensors waited over {horovod['after_s']} s "
                   f"for {missing or 'some ranks'}")
    first = beats[behind[0]] or {}
    return {"rank": behind[0], "host": first.get("host"), "reason": reason, "stalled": stalled}


def slow_step(beats: dict[int, dict | None], behind: list[int], bound: float,
              silence_s: float) -> str | None:
    """"step k has taken X s, its bound is Y s" when the culprit is inside a step (what
    the watch saw is slowness), else None."""
    b = beats.get(behind[0]) if behind else None
    if not b or b.get("phase") not in ("warm-up", "step") or b.get("where") in (None, "before"):
        return None
    return f"step {b.get('step')} has taken {silence_s:.0f} s, its bound is {bound:g} s"


def in_checkpoint(beats: dict[int, dict | None], behind: list[int], bound: float) -> str | None:
    """"stalled while saving a checkpoint (96 MB), ..." when a rank behind is in the
    checkpoint phase (its bound already allowed for the bytes at the assumed rate), else
    None."""
    b = next((beats[r] for r in behind if beats.get(r) and beats[r].get("phase") == "checkpoint"), None)
    if not b:
        return None
    doing = "loading" if b.get("where") == "load" else "saving"
    return (f"stalled while {doing} a checkpoint ({heartbeat.megabytes(b.get('checkpoint_bytes'))}); "
            f"its bound was {bound:g} s (lab.common.heartbeat.bound_s: its bytes at the rate "
            f"{heartbeat.CHECKPOINT_VAR} sets where the ranks run, never under the bound outside steps)")


def rendezvous(beats: dict[int, dict | None], behind: list[int], np: int) -> dict | None:
    """What a stalled rendezvous waited for and the fix to try, or None when no rank
    behind is in one (a rank without a heartbeat never ran the worker: its launcher's
    rendezvous)."""
    stuck = [r for r in behind if not beats[r] or beats[r]["phase"] in ("import", "rendezvous")]
    if not stuck:
        return None
    facts = next((b["rendezvous"] for b in beats.values() if b and b.get("rendezvous")), {})
    world, addr, port, iface = (facts.get(k) for k in ("world", "address", "port", "interface"))
    started = sum(1 for b in beats.values() if b)
    at = f" at {addr}:{port}" if addr else ""
    over = f" over {iface}" if iface else " over the interface the library picked (none was set)"
    said = (f"the rendezvous{at}{over} waited for {world or np} ranks; {started} of the {np} ranks "
            f"bench started reached it")
    if world and world != np:
        fix = (f"the ranks expect a world of {world} but bench started {np}: make the launcher's "
               f"process count (-np, --nproc-per-node times --nnodes) match the world size")
    elif started < np:
        fix = (f"rank(s) {', '.join(str(r) for r in stuck if not beats[r])} never ran the worker: "
               f"check that every node started its ranks (the launcher's output above)")
    else:
        fix = ("check that every node reaches that address and port (a firewall drops it) and "
               "that the interface is the nodes' network, not lo or docker0 (GLOO_SOCKET_IFNAME "
               "for DDP, horovodrun --network-interface for Horovod)")
    return {"world": world, "started": started, "address": addr, "port": port,
            "interface": iface, "explanation": f"{said}; fix: {fix}"}
