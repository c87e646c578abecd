"""Fusion planner (F10): choose a non-overlapping, legal set of candidates maximizing saving.

Candidates (rule matches and automatic clusters) arrive with an estimated saving and a
legality verdict from the cost model. The planner keeps only legal ones, then selects a set in
which no node is claimed twice and whose joint contraction is acyclic (two groups that are
each convex can still form a cycle together: A feeds B and B feeds A through different nodes).

Strategies:

* ``greedy``: largest saving first, skipping overlaps.
* ``dp``: exact maximum-saving selection inside every conflict component (candidates that share
  nodes, transitively), by dynamic programming over (candidate, claimed nodes); components larger than
  ``DP_LIMIT`` fall back to greedy plus swap improvement. Never below greedy.
* ``evolutionary``: a genetic search over selection orders (each chromosome is decoded
  greedily), seeded with the greedy order and elitist, so never below greedy; for very large
  conflict components.
* ``auto``: ``dp`` when every conflict component fits ``DP_LIMIT``, else ``evolutionary`` up to
  ``EVOLUTION_MAX_CANDIDATES`` candidates, else ``greedy``.

Every candidate not chosen keeps a reason code (``docs/reasons.md``, planner section).
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from graph_autofusion import reasons
from graph_autofusion.errors import OptionsError
from graph_autofusion.ir.core import Node

DP_LIMIT = 16
EVOLUTION_MAX_CANDIDATES = 20_000
#: Work budget of the evolutionary search per conflict component, in candidate decodes (one
#: fitness evaluation decodes every candidate of the component once): it caps the generations,
#: so the same candidates and seed give the same plan however loaded the machine is.
EVOLUTION_WORK = 3_000_000
STRATEGIES = ("auto", "greedy", "dp", "evolutionary")


class PlanReason:
    """Why the planner did not choose a candidate."""

    ILLEGAL = reasons.ILLEGAL  # the cost model or legality check refused it (its own code is kept)
    OVERLAP = reasons.OVERLAP  # shares nodes with a chosen candidate of larger total saving
    CYCLE = reasons.JOINT_CYCLE  # fusing it together with the chosen ones would create a cycle
    NO_SAVING = reasons.NO_SAVING  # estimated saving is not positive


@dataclass(eq=False)
class PlanCandidate:
    """One fusion the planner may choose.

    Attributes:
        key: Stable display name (``attention@/layer.0/Softmax``, ``cluster#3``).
        nodes: The IR nodes the fusion replaces.
        saving_s: Estimated time saved per run, seconds.
        legal: False when the cost model or legality checks refused it.
        code, message: The refusal's reason code and sentence (when not legal).
        priority: Rule priority (tie-break only).
        payload: What the caller attaches (rule match, cluster, cost record).
    """

    key: str
    nodes: tuple[Node, ...]
    saving_s: float
    legal: bool = True
    code: str = ""
    message: str = ""
    priority: int = 0
    payload: Any = None


@dataclass
class Rejected:
    candidate: PlanCandidate
    code: str
    message: str


@dataclass
class Plan:
    """The chosen candidates, the rejected ones with reasons, and the totals."""

    strategy: str
    chosen: list[PlanCandidate]
    rejected: list[Rejected]
    total_saving_s: float
    elapsed_s: float
    notes: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------- helpers
def _order_key(c: PlanCandidate) -> tuple:
    return (-c.saving_s, -c.priority, -len(c.nodes), c.key)


def _decode(order: Sequence[PlanCandidate]) -> list[PlanCandidate]:
    """Greedy decoding: take candidates in ``order`` unless they overlap a taken one."""
    claimed: set[Node] = set()
    taken = []
    for c in order:
        if claimed.isdisjoint(c.nodes):
            taken.append(c)
            claimed.update(c.nodes)
    return taken


def _total(cands: Iterable[PlanCandidate]) -> float:
    return sum(c.saving_s for c in cands)


def _components(cands: list[PlanCandidate]) -> list[list[PlanCandidate]]:
    """Conflict components: candidates linked by shared nodes (transitively)."""
    parent = list(range(len(cands)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: dict[Node, int] = {}
    for i, c in enumerate(cands):
        for n in c.nodes:
            j = owner.setdefault(n, i)
            if j != i:
                a, b = find(i), find(j)
                if a != b:
                    parent[a] = b
    groups: dict[int, list[PlanCandidate]] = {}
    for i, c in enumerate(cands):
        groups.setdefault(find(i), []).append(c)
    return list(groups.values())


def _exact(comp: list[PlanCandidate]) -> list[PlanCandidate]:
    """Maximum-saving disjoint subset of one component: dynamic programming over (candidate
    index, nodes already claimed), exact; at most 2**len(comp) states."""
    comp = sorted(comp, key=_order_key)
    sets = [frozenset(c.nodes) for c in comp]
    n = len(comp)
    memo: dict[tuple[int, frozenset], tuple[float, tuple[int, ...]]] = {}

    def go(i: int, used: frozenset) -> tuple[float, tuple[int, ...]]:
        if i == n:
            return 0.0, ()
        key = (i, used)
        hit = memo.get(key)
        if hit is not None:
            return hit
        best: tuple[float, tuple[int, ...]] = (-1.0, ())
        if used.isdisjoint(sets[i]):  # taking comes first: ties go to the earlier candidate
            val, picks = go(i + 1, used | sets[i])
            best = (val + comp[i].saving_s, (i, *picks))
        skip = go(i + 1, used)
        if skip[0] > best[0] + 1e-12 * max(1.0, abs(best[0])):
            best = skip
        memo[key] = best
        return best

    _, picks = go(0, frozenset())
    return [comp[i] for i in picks]


def _swap_improve(comp: list[PlanCandidate], chosen: list[PlanCandidate]) -> list[PlanCandidate]:
    """1-for-k swaps: add an unchosen candidate if it beats the chosen ones it overlaps."""
    improved = True
    current = list(chosen)
    while improved:
        improved = False
        for c in sorted(comp, key=_order_key):
            if c in current:
                continue
            clash = [d for d in current if not set(d.nodes).isdisjoint(c.nodes)]
            if c.saving_s > _total(clash) + 1e-15:
                current = [d for d in current if d not in clash] + [c]
                improved = True
    return current


def _evolve(
    cands: list[PlanCandidate], *, seed: int, generations: int, population: int, max_work: int
) -> list[PlanCandidate]:
    rng = random.Random(seed)
    base = sorted(cands, key=_order_key)
    pop = [list(base)]
    while len(pop) < population:
        order = list(base)
        for _ in range(max(1, len(order) // 20)):
            i, j = rng.randrange(len(order)), rng.randrange(len(order))
            order[i], order[j] = order[j], order[i]
        pop.append(order)

    def fitness(order: list[PlanCandidate]) -> float:
        return _total(_decode(order))

    scored = sorted(((fitness(o), k, o) for k, o in enumerate(pop)), key=lambda t: -t[0])
    counter = len(pop)
    generations = min(generations, max(1, max_work // max(1, population * len(cands))))
    for _ in range(generations):
        elite = scored[: max(2, population // 4)]
        children = []
        while len(children) < population - len(elite):
            a = rng.choice(elite)[2]
            b = rng.choice(elite)[2]
            cut = rng.randrange(1, max(2, len(a)))
            head = a[:cut]
            seen = set(map(id, head))
            child = head + [c for c in b if id(c) not in seen]
            for _ in range(rng.randint(1, 3)):
                i, j = rng.randrange(len(child)), rng.randrange(len(child))
                child[i], child[j] = child[j], child[i]
            children.append(child)
        fresh = []
        for o in children:
            counter += 1
            fresh.append((fitness(o), counter, o))
        scored = sorted(elite + fresh, key=lambda t: -t[0])
    return _decode(scored[0][2])


def _repair_cycles(chosen: list[PlanCandidate]) -> tuple[list[PlanCandidate], list[Rejected]]:
    """Drop the smallest-saving group on a cycle of the contracted graph until acyclic."""
    dropped: list[Rejected] = []
    current = list(chosen)
    while True:
        group_of: dict[Node, int] = {}
        for gi, c in enumerate(current):
            for n in c.nodes:
                group_of[n] = gi
        cyc = _cycle_groups(current, group_of)
        if not cyc:
            return current, dropped
        victim = min((current[g] for g in cyc), key=lambda c: (c.saving_s, c.key))
        others = sorted(current[g].key for g in cyc if current[g] is not victim)
        current = [c for c in current if c is not victim]
        dropped.append(
            Rejected(
                victim,
                PlanReason.CYCLE,
                f"fusing {victim.key} together with {others[:3]} would create a cycle",
            )
        )


def _cycle_groups(current: list[PlanCandidate], group_of: dict[Node, int]) -> set[int]:
    """Groups on (or between) cycles of the graph contracted by ``group_of``; empty if acyclic.

    Kahn's algorithm on the contracted graph, forward then backward, in O(nodes + edges): what
    survives both passes is the union of the cycles (and the paths joining them).
    """
    graph = next((n.graph for c in current for n in c.nodes), None)
    if graph is None or not current:
        return set()
    vid: dict[Node, Any] = {}
    for n in graph.nodes:
        g = group_of.get(n)
        vid[n] = ("g", g) if g is not None else n
    succ: dict[Any, set] = {}
    pred: dict[Any, set] = {}
    for n in graph.nodes:
        a = vid[n]
        succ.setdefault(a, set())
        pred.setdefault(a, set())
        for s in n.successors():
            b = vid.get(s)
            if b is not None and b != a:
                succ[a].add(b)
                pred.setdefault(b, set()).add(a)
    alive = set(succ)
    for forward in (True, False):
        inward = pred if forward else succ
        outward = succ if forward else pred
        deg = {v: len(inward[v] & alive) for v in alive}
        ready = [v for v, d in deg.items() if d == 0]
        while ready:
            v = ready.pop()
            alive.discard(v)
            for w in outward[v]:
                if w in alive:
                    deg[w] -= 1
                    if deg[w] == 0:
                        ready.append(w)
    return {v[1] for v in alive if isinstance(v, tuple)}


# --------------------------------------------------------------------------- entry point
def plan(
    candidates: Sequence[PlanCandidate],
    strategy: str = "auto",
    *,
    seed: int = 0,
    generations: int = 60,
    population: int = 24,
    max_work: int = EVOLUTION_WORK,
) -> Plan:
    """Choose a non-overlapping, legal, jointly acyclic set of candidates.

    The evolutionary search runs ``generations`` generations, fewer where a component is so
    large that they would exceed ``max_work`` candidate decodes: a deterministic budget, never
    wall-clock time.

    Raises:
        OptionsError: (a ValueError) unknown strategy.
    """
    if strategy not in STRATEGIES:
        raise OptionsError(f"unknown planner strategy {strategy!r}; known: {list(STRATEGIES)}")
    t0 = time.perf_counter()
    rejected: list[Rejected] = []
    usable: list[PlanCandidate] = []
    for c in candidates:
        if not c.legal:
            rejected.append(Rejected(c, c.code or PlanReason.ILLEGAL, c.message or "not legal"))
        elif c.saving_s <= 0:
            rejected.append(
                Rejected(c, PlanReason.NO_SAVING, f"estimated saving {c.saving_s:.3g} s")
            )
        else:
            usable.append(c)
    comps = _components(usable)
    notes: list[str] = []
    chosen_strategy = strategy
    if strategy == "auto":
        biggest = max((len(c) for c in comps), default=0)
        if biggest <= DP_LIMIT:
            chosen_strategy = "dp"
        elif len(usable) <= EVOLUTION_MAX_CANDIDATES:
            chosen_strategy = "evolutionary"
        else:
            chosen_strategy = "greedy"
        notes.append(
            f"auto chose {chosen_strategy}: {len(usable)} usable candidates, largest conflict "
            f"component {biggest}"
        )
    greedy = _decode(sorted(usable, key=_order_key))
    if chosen_strategy == "greedy":
        chosen = greedy
    elif chosen_strategy == "dp":
        chosen = []
        for comp in comps:
            if len(comp) <= DP_LIMIT:
                chosen.extend(_exact(comp))
            else:
                chosen.extend(_swap_improve(comp, _decode(sorted(comp, key=_order_key))))
                notes.append(f"component of {len(comp)} candidates: greedy plus swaps")
    else:
        chosen = []
        for comp in comps:
            if len(comp) == 1:
                chosen.extend(comp)
            else:
                chosen.extend(
                    _evolve(
                        comp,
                        seed=seed,
                        generations=generations,
                        population=population,
                        max_work=max_work,
                    )
                )
    greedy_total = _total(greedy)
    if _total(chosen) < greedy_total - 1e-9 * abs(greedy_total):  # never return less than greedy
        notes.append(f"{chosen_strategy} fell below greedy; greedy's selection kept")
        chosen = greedy
    chosen, cyc = _repair_cycles(chosen)
    rejected.extend(cyc)
    taken = set(chosen) | {r.candidate for r in cyc}
    owner = {n: c for c in chosen for n in c.nodes}
    for c in usable:
        if c in taken:
            continue
        winner = next((owner[n] for n in c.nodes if n in owner), None)
        msg = (
            f"shares nodes with {winner.key}, chosen for a larger total saving"
            if winner
            else "its nodes were freed by a cycle repair after selection"
        )
        rejected.append(Rejected(c, PlanReason.OVERLAP, msg))
    order = {id(c): i for i, c in enumerate(candidates)}
    chosen.sort(key=lambda c: order[id(c)])
    return Plan(chosen_strategy, chosen, rejected, _total(chosen), time.perf_counter() - t0, notes)
