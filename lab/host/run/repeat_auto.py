"""`--repeat auto`: repeat a sweep until the configurations it compares are told apart,
or a stated maximum of repeats is reached.

Compared are the configurations that ran at the same world (nodes and processes): the
report's tables put them side by side. After the first repeats of every combination (3:
lab.common.options.AUTO_FIRST), each round runs one more repeat of each configuration and
its closest neighbour in mean throughput at the same world while Welch's t interval of
the difference of their means (lab.common.repeat_stats) holds 0; the rest have been told
apart and are not run again. Every round is a look at the same pairs: each of the K looks
(AUTO_FIRST up to the maximum, one a round) uses the level 5% / K (Bonferroni), so that two
configurations that perform the same are called apart in any look at most 5% of the time
when the runs' noise is normal. It stops when every such pair has separated, when the next
round would pass the maximum, or early, when the repeats needed for 80% power at the
measured difference and spread (lab.common.repeat_stats.repeats_needed) are more than the
maximum allows: then the two perform the same within this machine's noise, and the line
says so."""
from __future__ import annotations

import dataclasses
import statistics

from lab.common import repeat_stats
from lab.common.options import AUTO_FIRST
from lab.host.request.plan import Job, label, record_key, run_keys


@dataclasses.dataclass(frozen=True)
class Row:
    """One configuration at one world, its ok runs' throughputs."""
    combination: int
    np: int
    nodes: int
    label: str
    values: tuple[float, ...]


def rows(plan, records: list[dict]) -> list[Row]:
    """The plan's configurations (combination, np) with the throughput of their ok runs."""
    keys = run_keys(plan)                   # a run's key without its repeat -> (combination, np)
    found: dict[tuple[int, int], list[float]] = {}
    for r in records:
        where = keys.get(record_key(r)[:-1]) if r.get("status") == "ok" else None
        tput = (r.get("figures") or {}).get("throughput_img_s")
        if where is not None and tput:
            found.setdefault(where, []).append(float(tput))
    return [Row(i, np, plan.combinations[i].nodes, label(plan.combinations[i]), tuple(v))
            for (i, np), v in sorted(found.items())]


def last_repeats(plan, records: list[dict]) -> dict[tuple[int, int], int]:
    """Each configuration's (combination, np) highest repeat index in its records, ok or
    not: its next repeat is the one after (indices run on without a gap per configuration)."""
    keys = run_keys(plan)
    last: dict[tuple[int, int], int] = {}
    for r in records:
        where = keys.get(record_key(r)[:-1])
        if where is not None:
            last[where] = max(last.get(where, -1), int(r.get("config", {}).get("repeat", 0)))
    return last


def looks(most: int) -> int:
    """How many looks a maximum of `most` repeats allows: one at AUTO_FIRST, then one a round."""
    return max(1, most - AUTO_FIRST + 1)


def undecided(table: list[Row], most: int) -> list[tuple[Row, Row]]:
    """Each world's neighbours by mean throughput not told apart at one look's level."""
    worlds: dict[tuple[int, int], list[Row]] = {}
    for row in table:
        worlds.setdefault((row.nodes, row.np), []).append(row)
    alpha = repeat_stats.look_alpha(looks(most))
    pairs = []
    for group in worlds.values():
        group.sort(key=lambda r: -statistics.fmean(r.values))
        for a, b in zip(group, group[1:]):
            if not repeat_stats.apart(list(a.values), list(b.values), alpha):
                pairs.append((a, b))
    return pairs


def _pair(a: Row, b: Row) -> str:
    world = f"np {a.np}" + (f" on {a.nodes} nodes" if a.nodes > 1 else "")
    return f"{a.label} and {b.label} ({world})"


def next_round(plan, records: list[dict], most: int) -> tuple[dict[tuple[int, int], int], str]:
    """{(combination, np): the ok repeats it should have after this round}, or {} and the
    one line that says why the repeats stop: one more repeat a round of each pair not told
    apart."""
    table = rows(plan, records)
    pairs = undecided(table, most)
    if not pairs:
        worlds = {(r.nodes, r.np) for r in table}
        if all(sum((r.nodes, r.np) == w for r in table) < 2 for w in worlds):
            return {}, "--repeat auto: nothing to compare (one configuration per world)"
        n = max((len(r.values) for r in table), default=0)
        return {}, f"--repeat auto: every compared configuration is told apart after {n} repeats"
    runs = max(max(len(a.values), len(b.values)) for a, b in pairs)
    alpha = repeat_stats.look_alpha(looks(most))
    needed = {(a, b): repeat_stats.repeats_needed(list(a.values), list(b.values), alpha) for a, b in pairs}
    hopeless = [p for p, n in needed.items() if n is not None and n > most]
    same = "; ".join(f"{_pair(a, b)} would need about {needed[(a, b)]} repeats each (80% power)"
                     for a, b in hopeless)
    if runs >= most:
        return {}, (f"--repeat auto: stopped at its maximum, {most} repeats; still not told apart: "
                    + "; ".join(_pair(a, b) for a, b in pairs))
    if len(hopeless) == len(pairs):
        return {}, (f"--repeat auto: stopped after {runs} repeats: at the measured spread {same}, "
                    f"more than its maximum {most}; they perform the same within this machine's noise")
    target = min(most, runs + 1)
    todo = {(r.combination, r.np): target for p in pairs if p not in hopeless for r in p}
    line = (f"--repeat auto: up to {target} repeats (at most {most}) of "
            + "; ".join(_pair(a, b) for a, b in pairs if (a, b) not in hopeless)
            + f" (not told apart: the {1 - alpha:.2%} interval of their difference holds 0)")
    if hopeless:
        line += f"; not repeated, the same within this machine's noise: {same}"
    return todo, line


def round_jobs(plan, records: list[dict]) -> tuple[list, str]:
    """The next round after the plan's own (the jobs, and the line that says why), while
    `next_round` names configurations: each configuration's missing repeats, interleaved
    (every one once, then again), each going on from its own last repeat; no jobs when
    every compared configuration is told apart or repeating cannot help."""
    todo, line = next_round(plan, records, plan.settings.repeat_max)
    if not todo:
        return [], line
    have = {(r.combination, r.np): len(r.values) for r in rows(plan, records)}
    last = last_repeats(plan, records)
    jobs = []
    for k in range(max(target - have.get(key, 0) for key, target in todo.items())):
        jobs += [Job(plan.combinations[i], i, np, last.get((i, np), -1) + 1 + k)
                 for (i, np), target in sorted(todo.items()) if target - have.get((i, np), 0) > k]
    return jobs, line


def finished_runs(plan, records: list[dict]) -> int:
    """How many of the plan's runs have a finished (ok) measurement so far: a round that
    adds none ends the repeats."""
    return sum(len(r.values) for r in rows(plan, records))
