"""A pairwise (2-way covering) set of cases: every pair of values of two factors that is
asked for appears in at least one case. Greedy, in the manner of AETG (Cohen et al.,
1997) with IPOG's order of factors (the largest first), deterministic: a case starts from
an uncovered pair, then takes, factor by factor, the value that covers the most uncovered
pairs with the values already chosen, among those the caller accepts; a tie goes to the
cheaper case, then to the value listed first. Of a few such cases, started from different
pairs, the one that covers the most is kept. Used by tests/test_combinations.py."""
from __future__ import annotations

import itertools
from typing import Callable

SEEDS = 6           # cases tried per case kept, each from another uncovered pair


def all_pairs(factors: dict[str, tuple]) -> list[tuple]:
    """Every pair of values of two factors, ((f, a), (g, b)) with f before g, in order."""
    names = list(factors)
    return [((f, a), (g, b)) for i, f in enumerate(names) for g in names[i + 1:]
            for a in factors[f] for b in factors[g]]


def pairs_of(case: dict, factors: dict[str, tuple]) -> set[tuple]:
    """The pairs a (possibly partial) case covers, in all_pairs' orientation."""
    names = [f for f in factors if f in case]
    return {((f, case[f]), (g, case[g])) for i, f in enumerate(names) for g in names[i + 1:]}


def cover(factors: dict[str, tuple], wanted: list[tuple], accepts: Callable[[dict], bool],
          cost: Callable[[dict], float] = lambda case: 0.0) -> list[dict]:
    """Cases (dicts of every factor) that together cover every pair of `wanted`, each
    accepted by `accepts` (which sees partial cases too: the factors not yet chosen at
    the caller's defaults; a pair it accepts must leave each further factor a value it
    accepts). A wanted pair that no case can hold is an error, named."""
    order = sorted(factors, key=lambda f: -len(factors[f]))     # stable: the table's order on ties
    rank = {p: i for i, p in enumerate(all_pairs(factors))}
    uncovered = sorted(set(wanted), key=rank.__getitem__)
    cases: list[dict] = []
    while uncovered:
        tried = [build(dict(seed), factors, order, set(uncovered), accepts, cost)
                 for seed in uncovered[:SEEDS]]
        best = max(tried, key=lambda c: (len(pairs_of(c, factors) & set(uncovered)), -cost(c)))
        new = pairs_of(best, factors) & set(uncovered)
        if not new:
            raise ValueError(f"no accepted case holds {uncovered[0]}")
        cases.append(best)
        uncovered = [p for p in uncovered if p not in new]
    return cases


def build(case: dict, factors: dict[str, tuple], order: list[str], uncovered: set,
          accepts: Callable[[dict], bool], cost: Callable[[dict], float]) -> dict:
    """One case from a seed pair (itself unchecked: the caller wants it), factor by factor."""
    for f in order:
        if f in case:
            continue
        best, best_key = None, None
        for i, v in enumerate(factors[f]):
            trial = {**case, f: v}
            if not accepts(trial):
                continue
            gain = sum(1 for g in case if _pair(factors, f, v, g, case[g]) in uncovered)
            key = (gain, -cost(trial), -i)
            if best_key is None or key > best_key:
                best, best_key = v, key
        if best_key is None:
            raise ValueError(f"no value of {f} is accepted beside {case}")
        case[f] = best
    return {f: case[f] for f in factors}


def _pair(factors: dict, f: str, a, g: str, b) -> tuple:
    names = list(factors)
    return ((f, a), (g, b)) if names.index(f) < names.index(g) else ((g, b), (f, a))


def check_covers(cases: list[dict], factors: dict[str, tuple], wanted: list[tuple]) -> list[tuple]:
    """The wanted pairs no case holds (empty when the cases cover them)."""
    have = set(itertools.chain.from_iterable(pairs_of(c, factors) for c in cases))
    return [p for p in wanted if p not in have]
