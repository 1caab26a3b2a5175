"""The v1 profile's state machine: random call sequences on a v1
``BlockPool``, judged step by step by the :class:`~.v1_driver.V1Driver`.

One rule per v1 operation (new blocks, cache full blocks, lookup, touch,
ordered free with and without ``evict_first``, evict, reset, the counts) and
one rule, on only with mistakes, that makes the caller mistakes of the v1
error table (:data:`~prefixcache.spec.v1_error_table.V1_ERROR_TABLE`), each
step noting its row.  Pools of mostly 1-7 ids (sometimes up to 24), hash
blocks of 1-3 tokens, blocks of one or two hash blocks, tokens from {0, 1, 2},
chains that reuse earlier chains' prefixes (duplicate keys), two salts and two
groups.  Half the examples are swarm examples, as in v0's machine, and the
plumbing (the budget, known findings that halt an example, one class per
signature) is v0's (:class:`~prefixcache.oracle.machine.LockstepMachine`).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Set, Tuple, Type

from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import initialize

from ..model.v1_model import V1Model
from ..spec.semantics import Semantics
from ..spec.v1_error_table import V1_ERROR_TABLE
from .machine import LockstepMachine, Stats, machine_rule, make_machine, swarm_rules
from .targets import Target
from .v1_driver import V1Driver

Tokens = Tuple[int, ...]
TOKEN = st.integers(0, 2)
SALTS = st.sampled_from([None, None, "a"])
GROUPS = st.integers(0, 1)


class V1Machine(LockstepMachine[V1Driver]):
    """Drives a target pool and the v1 model in lockstep (``config`` says
    which target and how; :func:`make_v1_machine` makes the subclass)."""

    def __init__(self) -> None:
        super().__init__()
        self.held: List[int] = []  # one entry per reference the caller holds
        #: every chain cached or looked up so far: (tokens, salt, group)
        self.chains: List[Tuple[List[Tokens], Optional[str], int]] = []
        #: every block cached so far: (its chain, salt, group, blocks' scale, position)
        self.entries: List[Tuple[List[Tokens], Optional[str], int, int, int]] = []

    @property
    def model(self) -> V1Model:
        return self.d.model

    def size(self) -> int:
        return self.d.trace.block_size

    def free_args(self, ids: List[int], evict_first: bool = False) -> Dict[str, Any]:
        """The arguments of ``free_blocks(ids)``: ``evict_first`` too where the
        pool takes it (so a trace of an earlier release's pool reads as its
        own calls)."""
        if self.d.evict_first:
            return dict(ordered_blocks=ids, evict_first=evict_first)
        return dict(ordered_blocks=ids)

    def nameable(self, ids: Any) -> List[int]:
        return [i for i in ids if self.d.can_name(i)]

    # -- setup ----------------------------------------------------------------------------

    @initialize(data=st.data())
    def begin(self, data: st.DataObject) -> None:
        """Draw the pool (mostly tiny), the hash block size and, in a swarm
        example, the rules switched off; then build the target and model."""
        large = data.draw(st.integers(0, 7), label="size class") == 7
        num_blocks = data.draw(st.integers(8, 24) if large else st.integers(1, 7),
                               label="num_blocks")
        hash_block_size = data.draw(st.integers(1, 3), label="hash_block_size")
        self.draw_swarm(data, V1_SWARM_RULES)
        config = self.config
        self.driver = V1Driver(config.target, num_blocks, hash_block_size,
                               white_box=config.white_box, semantics=config.semantics,
                               mistakes=config.mistakes, call_timeout=config.call_timeout)

    # -- valid operations -----------------------------------------------------------------

    @machine_rule(swarm=False, data=st.data())
    def new_blocks(self, data: st.DataObject) -> None:
        """``get_new_blocks(n)``: mostly what is free, now and then one more
        (a refusal: not a mistake, a request that cannot be met now)."""
        free = self.model.get_num_free_blocks()
        n = data.draw(st.integers(0, free + 1), label="n")
        taken = self.model.queue[:n]  # what the model hands out
        self.run("get_new_blocks", num_blocks=n)
        if not self.d.refused:
            self.held += taken

    def _chain(self, data: st.DataObject, need: int, salt: Optional[str],
               group: int) -> List[Tokens]:
        """``need`` hash blocks of tokens: half the time the start of an
        earlier chain of the same salt and group (so keys repeat)."""
        size = self.size()
        block = st.tuples(*[TOKEN] * size)
        same = [c for c, s, g in self.chains if s == salt and g == group]
        old: List[Tokens] = []
        if same and bool(data.draw(st.booleans(), label="reuse?")):
            old = list(data.draw(st.sampled_from(same), label="reuse"))[:need]
        rest = need - len(old)
        return old + data.draw(st.lists(block, min_size=rest, max_size=rest), label="tokens")

    @machine_rule(when=lambda self: self.held, data=st.data(), salt=SALTS, group=GROUPS,
                  scale=st.sampled_from([1, 1, 2]), null=st.booleans())
    def cache(self, data: st.DataObject, salt: Optional[str], group: int, scale: int,
              null: bool) -> None:
        """``cache_full_blocks`` of held blocks (the null block first, now
        and then): a request's blocks, some already cached before
        ``num_cached_blocks``; a block cached over fewer tokens may be
        cached again further on."""
        ids = data.draw(st.permutations(sorted(set(self.held))), label="order")
        ids = ([0] if null else []) + ids[:data.draw(st.integers(1, len(ids)), label="len")]
        num_full = data.draw(st.integers(1, len(ids)), label="num_full")
        num_cached = data.draw(st.integers(0, num_full - 1), label="num_cached")
        block_size = scale * self.size()
        if any(self.model.key_of.get(i, (None, 0))[1] >= (k + 1) * block_size
               for k, i in enumerate(ids[:num_full]) if k >= num_cached and i != 0):
            return  # caching over as many tokens again is a mistake (not made here)
        tokens = self._chain(data, num_full * scale, salt, group)
        self.chains.append((tokens, salt, group))
        self.run("cache_full_blocks", tokens=[list(t) for t in tokens], salt=salt,
                 blocks=ids, num_cached_blocks=num_cached, num_full_blocks=num_full,
                 block_size=block_size, kv_cache_group_id=group)
        self.entries += [(tokens, salt, group, scale, k) for k in range(num_cached, num_full)
                         if ids[k] != 0]

    @machine_rule(data=st.data(), when=lambda self: bool(
        self.entries and set(self.held) - set(self.model.key_of)))
    def duplicate(self, data: st.DataObject) -> None:
        """Cache a held, uncached block under a key cached before (a
        duplicate: two requests that filled a block alike)."""
        tokens, salt, group, scale, k = data.draw(st.sampled_from(self.entries), label="key")
        block = data.draw(st.sampled_from(sorted(set(self.held) - set(self.model.key_of))),
                          label="block")
        self.run("cache_full_blocks", tokens=[list(t) for t in tokens[:(k + 1) * scale]],
                 salt=salt, blocks=[0] * k + [block], num_cached_blocks=k,
                 num_full_blocks=k + 1, block_size=scale * self.size(), kv_cache_group_id=group)

    @machine_rule(data=st.data(), salt=SALTS, group=GROUPS)
    def lookup(self, data: st.DataObject, salt: Optional[str], group: int) -> None:
        """``get_cached_block`` of a chain's last hash: a prefix of a chain
        cached before (under its salt, or the other) or a new one; one or
        two groups."""
        if self.entries and bool(data.draw(st.booleans(), label="a cached block's key")):
            chained, salt, group, scale, k = data.draw(st.sampled_from(self.entries),
                                                       label="entry")
            tokens = chained[:(k + 1) * scale]
        else:
            tokens = self._chain(data, data.draw(st.integers(1, 3), label="length"), salt,
                                 group)
        groups = data.draw(st.lists(GROUPS, min_size=0, max_size=1), label="groups")
        groups.insert(data.draw(st.integers(0, len(groups)), label="where"), group)
        self.run("get_cached_block", tokens=[list(t) for t in tokens], salt=salt,
                 kv_cache_group_ids=groups)

    @machine_rule(data=st.data())
    def touch(self, data: st.DataObject) -> None:
        """``touch`` of held or cached blocks (the null block too), as a
        request that hits them does; each touched block is held once more."""
        allowed = self.nameable(sorted(set(self.held) | set(self.model.key_of) | {0}))
        ids = data.draw(st.lists(st.sampled_from(allowed), max_size=3), label="ids")
        self.run("touch", blocks=ids)
        self.held += [i for i in ids if i != 0]

    @machine_rule(when=lambda self: self.held, data=st.data(), null=st.booleans())
    def free(self, data: st.DataObject, null: bool) -> None:
        """``free_blocks`` of some held references, in any order (a request
        frees its tail first), with or without ``evict_first`` (always
        without on a pool that does not take it)."""
        evict_first = self.d.evict_first and data.draw(st.booleans(), label="evict_first")
        order = data.draw(st.permutations(range(len(self.held))), label="order")
        chosen = order[:data.draw(st.integers(1, len(order)), label="count")]
        ids = [self.held[k] for k in chosen]
        self.held = [i for k, i in enumerate(self.held) if k not in set(chosen)]
        self.run("free_blocks", **self.free_args(ids + ([0] if null else []), evict_first))

    @machine_rule(data=st.data())
    def evict(self, data: st.DataObject) -> None:
        """``evict_blocks`` of cached ids, or any id of the pool."""
        ids = st.sampled_from(sorted(self.model.key_of) or [0]) | st.integers(
            0, self.model.num_blocks - 1)
        self.run("evict_blocks", block_ids=sorted(set(data.draw(st.lists(ids, max_size=3),
                                                                label="ids"))))

    @machine_rule(op=st.sampled_from(["get_num_free_blocks", "get_usage",
                                      "reset_prefix_cache"]))
    def counts(self, op: str) -> None:
        """``get_num_free_blocks()``, ``get_usage()`` or ``reset_prefix_cache()``
        (in one rule, so that resets do not empty the cache every few steps)."""
        self.run(op)

    # -- caller mistakes --------------------------------------------------------------------

    @machine_rule(when=lambda self: self.config.mistakes, swarm=False, data=st.data())
    def caller_mistakes(self, data: st.DataObject) -> None:
        """One mistake of the v1 error table that can be made now (the driver
        notes in the step the row the model names)."""
        provokers = {key: make for key, make in self._provokers().items() if make is not None}
        if not provokers:
            return
        key = data.draw(st.sampled_from(sorted(provokers)), label="mistake")
        label = f"mistake:{key}"
        event(label)
        self.config.stats.coverage[label] += 1
        op, args = provokers[key](data)
        self.run(op, **args)

    def _provokers(self) -> Dict[str, Optional[Callable[[st.DataObject],
                                                         Tuple[str, Dict[str, Any]]]]]:
        """Row key -> how to make that mistake now (None: not possible now)."""
        m = self.model
        n = m.num_blocks
        free = self.nameable(i for i in m.queue)
        free_plain = [i for i in free if i not in m.key_of]
        held_once = [i for i in sorted(set(self.held)) if m.ref[i] == 1]
        held_cached = [i for i in sorted(set(self.held)) if i in m.key_of]
        held_plain = [i for i in sorted(set(self.held)) if i not in m.key_of]
        size = self.size()

        def one(ids: List[int]) -> Callable[[st.DataObject], int]:
            return lambda data: data.draw(st.sampled_from(ids), label="block")

        def fresh(data: st.DataObject, blocks: int) -> List[List[int]]:
            return [list(t) for t in self._chain(data, blocks, None, 0)]

        def cache_one(pick: Callable[[st.DataObject], int]
                      ) -> Callable[[st.DataObject], Tuple[str, Dict[str, Any]]]:
            return lambda data: ("cache_full_blocks", dict(
                tokens=fresh(data, 1), salt=None, blocks=[pick(data)], num_cached_blocks=0,
                num_full_blocks=1, block_size=size, kv_cache_group_id=0))

        def too_few(data: st.DataObject) -> Tuple[str, Dict[str, Any]]:
            ids = data.draw(st.permutations(held_plain), label="order")[:2]
            return "cache_full_blocks", dict(
                tokens=fresh(data, len(ids) - 1), salt=None, blocks=ids, num_cached_blocks=0,
                num_full_blocks=len(ids), block_size=size, kv_cache_group_id=0)

        def unknown(data: st.DataObject) -> Tuple[str, Dict[str, Any]]:
            ids = [n + data.draw(st.integers(0, 2), label="past")]
            if m.key_of and bool(data.draw(st.booleans(), label="with a cached id")):
                ids.insert(0, data.draw(st.sampled_from(sorted(m.key_of)), label="cached"))
            return "evict_blocks", dict(block_ids=ids)

        def lookup_none(data: st.DataObject) -> Tuple[str, Dict[str, Any]]:
            return "get_cached_block", dict(tokens=fresh(data, 1), salt=None,
                                            kv_cache_group_ids=[])

        return {
            "get_new_blocks:negative": lambda data: (
                "get_new_blocks", dict(num_blocks=-data.draw(st.integers(1, 2), label="n"))),
            "free_blocks:unreferenced": (lambda data: (
                "free_blocks", self.free_args([one(free)(data)]))) if free else None,
            "free_blocks:repeated": (lambda data: (
                "free_blocks", self.free_args([one(held_once)(data)] * 2)))
            if held_once else None,
            "touch:not-cached-free": (lambda data: (
                "touch", dict(blocks=[one(free_plain)(data)]))) if free_plain else None,
            "cache_full_blocks:unreferenced": cache_one(one(free)) if free else None,
            "cache_full_blocks:already-cached": cache_one(one(held_cached))
            if held_cached else None,
            "cache_full_blocks:too-few-hashes": too_few if held_plain else None,
            "evict_blocks:unknown-id": unknown,
            "evict_blocks:negative-id": lambda data: (
                "evict_blocks", dict(block_ids=[-data.draw(st.integers(1, 2), label="id")])),
            "get_cached_block:no-groups": lookup_none,
        }


#: Every row of the v1 error table that is a caller mistake has a provoker
#: (``get_new_blocks:too-many`` is a refusal the valid rule makes).
V1_MISTAKE_ROWS = tuple(r.key for r in V1_ERROR_TABLE if r.key != "get_new_blocks:too-many")

#: The rules a swarm example may switch off: all but new_blocks and caller_mistakes.
V1_SWARM_RULES = swarm_rules(V1Machine, "new_blocks", "caller_mistakes")


def make_v1_machine(target: Target, *, mistakes: bool = True, white_box: bool = True,
                    stats: Optional[Stats] = None, semantics: Optional[Semantics] = None,
                    call_timeout: Optional[float] = None,
                    known: Optional[Set[str]] = None) -> Type[V1Machine]:
    """The machine class that judges the v1 pool ``target`` against the v1
    model (the arguments as :func:`~prefixcache.oracle.machine.make_machine`'s,
    whose configuration it takes)."""
    config = make_machine(target, mistakes=mistakes, white_box=white_box, stats=stats,
                          semantics=semantics, call_timeout=call_timeout, known=known).config
    return type("V1Machine_v1", (V1Machine,), {"config": config})
