"""The analysis, every sentence computed from the figures: at most three findings first,
each with its interval (the best and the worst scaling among the configurations that
learned, and what did not learn), then which configurations were left out of the
ranking and why, the ranking itself as a table (speedup, efficiency, compute against
communication), and what compression kept and saved.

Ranked are the data-parallel runs with more than one worker whose configuration learned
(accuracy at least records.LEARNED_AT times chance, where accuracy is measured) and whose
ranks were not oversubscribed: a run at chance is fast because it does not learn, and an
oversubscribed one measures ranks sharing cores, not scaling."""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from lab.common import stats
from lab.report import summary
from lab.report.records import (
    LEARNED_AT,
    chance,
    config_label,
    data_parallel,
    learned,
    oversubscribed,
    oversubscription_text,
)
from lab.report.tables import compression_groups, row_oversubscribed

MAX_FINDINGS = 3
RANKING_HEADERS = ["rank", "configuration", "workers", "servers", "speedup", "efficiency",
                   "compute (ms)", "communication (ms)", "ratio"]


@dataclass
class Analysis:
    findings: list = field(default_factory=list)    # at most MAX_FINDINGS sentences
    left_out: list = field(default_factory=list)    # what was not ranked, and why
    ranking: list = field(default_factory=list)     # rows under RANKING_HEADERS
    rest: list = field(default_factory=list)        # compression, failures

    def sentences(self) -> list[str]:
        return self.findings + self.left_out + self.rest


PRACTICAL_REPEATS = 30     # more repeats than this to tell two rows apart: the same, for a lab


def _repeats_needed(row: dict, other: dict, named: dict) -> str:
    """How many repeats would tell two overlapping rows apart at their measured spread."""
    a = [r["figures"]["throughput_img_s"] for r in row["records"]]
    b = [r["figures"]["throughput_img_s"] for r in other["records"]]
    n = stats.repeats_to_separate(a, b)
    if n is None:
        return ""
    diff = abs(statistics.median(a) / statistics.median(b) - 1)
    if n <= min(len(a), len(b)):
        n = max(n, stats.BOOTSTRAP_FROM, min(len(a), len(b)) + 1)
        return (f" (the closest, {named[id(other)]}, differs by {diff:.0%} in throughput; at the "
                f"spread of these repeats that is enough, but below {stats.BOOTSTRAP_FROM} repeats "
                f"the interval is the repeats' whole range: `--repeat {n}` gives a bootstrap one)")
    if n > PRACTICAL_REPEATS:
        return (f" (the closest, {named[id(other)]}, differs by {diff:.1%} in throughput: at the "
                f"spread of these repeats about {n} repeats of each would tell them apart, so "
                f"for practical purposes they perform the same)")
    return (f" (the closest, {named[id(other)]}, differs by {diff:.0%} in throughput: at the "
            f"spread of these repeats, about {n} repeats of each would tell them apart, "
            f"`--repeat {n}`)")


def interval(s, scale: float = 1.0, fmt: str = "{:.2f}") -> str:
    """'1.71 (1.21-2.29)', or '1.71 (one run, no interval)'."""
    text = fmt.format(s.median * scale)
    if s.n > 1 and s.kind != "baseline":
        return f"{text} ({fmt.format(s.low * scale)}-{fmt.format(s.high * scale)})"
    return f"{text} (one run, no interval)"


def _listing(values) -> str:
    values = list(values)
    return values[0] if len(values) == 1 else ", ".join(values[:-1]) + " and " + values[-1]


def _accuracy_range(runs: list[dict]) -> str:
    accs = sorted(summary.accuracy(r) for r in runs)
    n = len(accs)
    if accs[0] == accs[-1]:
        return f"{accs[0]:.2%}" + (f" in each of {n} runs" if n > 1 else "")
    return f"{accs[0]:.2%}-{accs[-1]:.2%} over {n} runs"


def _candidates(table: list[dict]) -> list[dict]:
    return [row for row in table if "failed" not in row and row.get("efficiency") is not None
            and row["np"] > 1 and data_parallel(row["record"])]


def analysis(records: list[dict]) -> Analysis:
    out = Analysis()
    table = summary.rows(records)
    # A configuration that did not learn at any worker count is not ranked at any.
    not_learned: dict = {}
    for row in table:
        if "failed" not in row and any(learned(r) is False for r in row["records"]):
            not_learned.setdefault(summary.config_key(row["record"]), []).extend(row["records"])
    base = {summary.config_key(row["record"]): row for row in table
            if "failed" not in row and row["np"] == 1}
    ranked, over = [], []
    for row in _candidates(table):
        key = summary.config_key(row["record"])
        if key in not_learned:
            continue
        # its own runs or its 1-worker baseline's: either way the speedup is not scaling
        b = base.get(key)
        (over if row_oversubscribed(row) or (b and row_oversubscribed(b)) else ranked).append(row)
    ranked.sort(key=lambda row: (-row["np"], -row["efficiency"]))
    label = {id(row): config_label(row["record"], records) for row in table}
    # where rows differ in servers, a sentence says on how many
    across = len({row["servers"] for row in ranked + over}) > 1
    named = {id(row): label[id(row)] + (f" on {row['servers']} server{'s' if row['servers'] > 1 else ''}"
                                        if across else "") for row in ranked + over}

    # ---- the ranking table
    place = {}
    for row in ranked:
        place[row["np"]] = place.get(row["np"], 0) + 1
        b = base.get(summary.config_key(row["record"]))
        compute = b["time per step (ms)"] if b else None
        comm = row["time per step (ms)"] - compute if b else None
        out.ranking.append([
            place[row["np"]], label[id(row)], row["np"], row["servers"],
            summary.with_spread(row, "speedup"), summary.with_spread(row, "efficiency"),
            "n/a" if compute is None else f"{compute:.1f}",
            "n/a" if comm is None else f"{comm:.1f}",
            "n/a" if comm is None or comm <= 0 else f"{compute / comm:.2f}"])

    # ---- the findings
    findings = []
    if ranked:
        top_np = ranked[0]["np"]
        at_top = [row for row in ranked if row["np"] == top_np]
        best = at_top[0]
        sp = best["speedup_summary"]
        text = (f"Best scaling at {top_np} workers: {named[id(best)]}, speedup {interval(sp)}, "
                f"efficiency {interval(sp, 1 / top_np, '{:.0%}')}, "
                f"{best['throughput (img/s)']:,.0f} images/s")
        others = at_top[1:]
        tied = [row for row in others if sp.overlaps(row["speedup_summary"])]
        if others and sp.n > 1:
            text += (f"; its interval overlaps {len(tied)} of the other {len(others)} ranked "
                     f"configurations' at this count, so the runs do not tell it apart from them"
                     if tied else "; its interval is above every other ranked configuration's")
            if tied:
                text += _repeats_needed(best, tied[0], named)
        elif others:
            text += "; one run each, so no interval says whether the difference is real"
        findings.append(text + ".")
        if len(at_top) > 1:
            worst = at_top[-1]
            ws = worst["speedup_summary"]
            b = base.get(summary.config_key(worst["record"]))
            text = (f"Worst scaling at {top_np} workers: {named[id(worst)]}, speedup {interval(ws)}, "
                    f"efficiency {interval(ws, 1 / top_np, '{:.0%}')}")
            if ws.high < 1:
                text += (f": slower with {top_np} workers than with one"
                         + (", across its whole interval" if ws.n > 1 else ""))
            if b:
                text += (f"; its step took {worst['time per step (ms)']:.1f} ms against "
                         f"{b['time per step (ms)']:.1f} ms with one worker")
            findings.append(text + ".")
    if not_learned:
        runs = [r for rs in not_learned.values() for r in rs]
        names = sorted({config_label(r, records) for r in runs})
        ch = chance(runs[0])
        text = (f"Did not learn: {_listing(names)}, accuracy {_accuracy_range(runs)} against "
                f"{ch:.0%} by chance, so {'its' if len(names) == 1 else 'their'} speed is not "
                f"ranked")
        zeroed = [r["figures"]["codec_zeroed_fraction"] for r in runs
                  if r["figures"].get("codec_zeroed_fraction") is not None
                  and r["config"].get("compression") == "int8-naive"]
        if zeroed:
            text += (f"; the naive 8-bit cast sent {min(zeroed):.1%}"
                     + (f"-{max(zeroed):.1%}" if max(zeroed) != min(zeroed) else "")
                     + " of the nonzero gradient values as 0 (a cast to int8 truncates every value "
                       "below 1, so the weights barely moved; scaling each chunk into the 8-bit "
                       "range, int8, keeps them)")
        findings.append(text + ".")
    if over:
        findings.append(f"Oversubscribed: {_listing(sorted({named[id(row)] for row in over}))} ran "
                        f"more busy threads than cores, so {'its' if len(over) == 1 else 'their'} "
                        f"speedup measures ranks sharing cores and is not ranked.")
    out.findings = findings[:MAX_FINDINGS]

    # ---- what was left out, and why
    if not_learned:
        rs = next(iter(not_learned.values()))
        names = sorted({config_label(r[0], records) for r in not_learned.values()})
        out.left_out.append(
            f"Left out of the ranking as not having learned (accuracy below {LEARNED_AT:g} times "
            f"chance, {LEARNED_AT * chance(rs[0]):.0%}): {_listing(names)}.")
    if over:
        parts = []
        for row in over:
            b = base.get(summary.config_key(row["record"]))
            own = sorted({oversubscription_text(r) for r in row["records"] if oversubscribed(r)})
            theirs = sorted({oversubscription_text(r) for r in (b or {}).get("records", [])
                             if oversubscribed(r)})
            parts.append(f"{named[id(row)]} at {row['np']} workers ("
                         + "; ".join(own + [f"its 1-worker baseline: {t}" for t in theirs]) + ")")
        parts = sorted(set(parts))
        out.left_out.append(f"Left out of the ranking as oversubscribed (more busy threads than "
                            f"cores: the time measures ranks sharing cores): {_listing(parts)}.")
    if any(learned(row["record"]) is None for row in ranked):
        out.left_out.append("Accuracy was not measured for some ranked runs (synthetic data): "
                            "they are ranked on speed alone.")
    out.rest = _compression(records, set(not_learned)) \
        + _did_not_finish(records)
    if not out.sentences() and not ranked:      # say why, rather than an empty section
        ok = [row for row in table if "failed" not in row and data_parallel(row["record"])]
        unscaled = sorted({label[id(row)] for row in ok if row["np"] > 1
                           and summary.config_key(row["record"]) not in base})
        if unscaled:
            across = any(row["servers"] > 1 for row in ok)
            out.left_out.append(f"Nothing to rank: a speedup needs the same configuration with 1 "
                                f"worker, and {_listing(unscaled)} ran without one: add 1 to --np "
                                + ("and to --nodes (--nodes 1,2 --np 1,2)." if across else "(--np 1,2)."))
        elif ok and all(row["np"] == 1 for row in ok):
            out.left_out.append("Nothing to rank: a speedup needs runs of more than 1 worker beside "
                                "the 1-worker one (--np 1,2).")
    return out


def _compression(records: list[dict], explained: set) -> list[str]:
    """Per codec, against uncompressed at the same worker count: what accuracy it kept and
    what it saved; one sentence per codec, or per configuration where there is one. A
    codec whose every configuration a finding already named as not learning is not
    repeated (explained: their summary.config_key)."""
    out = []
    groups = [(key, comps) for key, comps in sorted(compression_groups(records).items(), key=str)
              if comps.get("none") and key[3] > 1 and summary.accuracy(comps["none"]) is not None]
    for name in ("fp16", "int8", "int8-naive"):
        have = [(key, comps) for key, comps in groups if name in comps]
        if not have:
            continue
        facts = []
        for key, comps in have:
            plain, f = comps["none"]["figures"], comps[name]["figures"]
            saved = (1 - f["payload_bytes_per_step"] / plain["payload_bytes_per_step"]
                     if f.get("payload_bytes_per_step") and plain.get("payload_bytes_per_step") else None)
            facts.append((key, comps, f["test_accuracy"] - plain["test_accuracy"], saved,
                          f["step_time_mean_s"], plain["step_time_mean_s"]))
        if all(summary.config_key(comps[name]) in explained for _, comps in have):
            continue
        if len(facts) == 1:
            key, comps, delta, saved, step, plain_step = facts[0]
            who = config_label(comps["none"], records)
            out.append(f"{who}, {key[3]} workers: {name} reached "
                       f"{comps[name]['figures']['test_accuracy']:.2%} against "
                       f"{comps['none']['figures']['test_accuracy']:.2%} uncompressed "
                       f"({delta * 100:+.2f} points)"
                       + (f" and handed {saved:.0%} fewer gradient bytes to the collective"
                          if saved is not None else "")
                       + f"; its step took {step * 1000:.1f} ms against {plain_step * 1000:.1f} ms.")
            continue
        deltas = [x[2] * 100 for x in facts]
        saves = sorted({f"{x[3]:.0%}" for x in facts if x[3] is not None})
        faster = sum(1 for x in facts if x[4] < x[5])
        nps = sorted({x[0][3] for x in facts})
        out.append(f"{name} against uncompressed in {len(facts)} configurations at "
                   f"{_listing([str(n) for n in nps])} workers: accuracy {min(deltas):+.2f} to "
                   f"{max(deltas):+.2f} points"
                   + (f", {'/'.join(saves)} fewer gradient bytes handed to the collective"
                      if saves else "")
                   + f"; its step was faster in {faster} of {len(facts)}.")
    return out


def _did_not_finish(records: list[dict]) -> list[str]:
    out = []
    bad = [r for r in records if r.get("status") == "failed"]
    if bad:
        out.append(f"{len(bad)} run(s) failed; the notes under their tables give the rank, host "
                   f"and reason recorded.")
        for r in bad:     # bench's stall watch (lab.host.watch.stall): the diagnosis, in full
            if "stalled" in (r.get("error") or {}):
                c = r["config"]
                out.append(f"{c.get('framework')} over {c.get('backend')}, {r['world']['np']} "
                           f"workers, {r['error']['reason']}")
    skipped = [r for r in records if r.get("status") == "skipped"]
    if skipped:
        out.append(f"{len(skipped)} combination(s) could not run on this machine and were skipped "
                   f"(\"Combinations that did not run\" gives the reasons).")
    return out
