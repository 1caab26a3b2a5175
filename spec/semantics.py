"""The semantic options: where prefixcache's rule is stricter than vLLM 0.8.5's
on a call that vLLM's API allows, both rules, named.

A fault is a fault under every option (a leak, a wrong id, a counted free
block that cannot be allocated, a hit on other content, an eviction order
the documented rule forbids).  An option covers only a place where vLLM
0.8.5 behaves consistently, by a looser rule of its own, that an allocator
claiming vLLM's behaviour may keep.  :class:`Semantics` holds one value per
option (``False``: prefixcache's rule, ``True``: vLLM 0.8.5's); the model
executes either (:class:`~prefixcache.model.Model`'s ``semantics``), the
oracle judges by them, and :data:`PRESETS` names the two usual sets:

* ``prefixcache``: every rule of this spec (the default);
* ``vllm-0.8.5``: vLLM 0.8.5's observable behaviour on calls within its
  typed API.

:data:`OPTIONS` states each option once, with both rules and the reason for
ours; SPEC.md's table of options is rendered from it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Dict, Tuple


@dataclass(frozen=True)
class Semantics:
    """One value per option: ``True`` where vLLM 0.8.5's rule applies."""

    computed_on_release: bool = False
    failed_query_counted: bool = False
    any_mistake_exception: bool = False
    lists_only: bool = False

    @property
    def name(self) -> str:
        """The preset these values are, or ``prefixcache+option,...``."""
        for name, preset in PRESETS.items():
            if preset == self:
                return name
        return "+".join(["prefixcache"] + [o.name for o in OPTIONS if self.value(o)])

    def value(self, option: Option) -> bool:
        """This set's value of ``option``."""
        return bool(getattr(self, option.field))

    def flipped(self, option: Option) -> Semantics:
        """The same values with ``option`` switched to its other rule."""
        return replace(self, **{option.field: not self.value(option)})

    def to_json(self) -> Dict[str, bool]:
        """The values by option name, for reports and traces."""
        return {o.name: self.value(o) for o in OPTIONS}

    @classmethod
    def from_json(cls, data: object) -> Semantics:
        """The set a report or trace names: a preset's name, or option
        name -> value (ValueError for anything else)."""
        if isinstance(data, str):
            return preset(data)
        if not isinstance(data, dict):
            raise ValueError(f"semantics must be a preset name or a dict, not {data!r}")
        by_name = {o.name: o for o in OPTIONS}
        unknown = sorted(set(data) - set(by_name))
        if unknown or not all(isinstance(v, bool) for v in data.values()):
            raise ValueError(f"unknown options or values in {data!r}; options: {sorted(by_name)}")
        return cls(**{by_name[k].field: v for k, v in data.items()})


@dataclass(frozen=True)
class Option:
    """One option: its name, what it decides, both rules and why ours."""

    field: str
    name: str
    decides: str
    prefixcache: str
    vllm: str
    why: str


OPTIONS: Tuple[Option, ...] = (
    Option(
        "computed_on_release", "computed-on-release",
        "whether an id promoted since the last mark_blocks_as_computed counts as computed "
        "once its last reference goes (block_is_computed, find_cached_blocks_prefix)",
        "no: it stays touched, not computed, in the evictor and after a hit restores it, "
        "until mark_blocks_as_computed",
        "yes: an id in the evictor is computed, and a hit that restores it restores it computed",
        "the batch that promoted the block may never have run (the request was preempted "
        "or aborted before its step), so its KV may not exist; reporting it computed lets a "
        "later request skip the prefill of KV that was never written",
    ),
    Option(
        "failed_query_counted", "failed-query-counted",
        "whether an allocation refused with NoFreeBlocksError counts its cache queries in "
        "get_prefix_cache_hit_rate",
        "no: a refused call changes nothing, the hit-rate counters included",
        "yes: each block looked up before the refusal, the refused one included, is counted",
        "every call is all-or-nothing; a metric that counts requests that were never served "
        "drifts under memory pressure, exactly when operators read it",
    ),
    Option(
        "any_mistake_exception", "any-mistake-exception",
        "which exception a caller mistake (a row of the error table) raises",
        "the row's class (each also derives from what vLLM raised: AssertionError, "
        "ValueError, KeyError)",
        "any exception: vLLM answers most mistakes with an assert, some with whatever the "
        "bad argument raises; the state must still be unchanged",
        "an assert disappears under python -O, and a mistake must be told apart from a "
        "fault of the allocator by its class",
    ),
    Option(
        "lists_only", "lists-only",
        "what a List argument of the API accepts (get_common_computed_block_ids' id lists)",
        "any sequence of ints, tuples included (the oracle passes some tuples when it makes "
        "mistakes)",
        "lists only: another sequence is outside the typed API, and the oracle never passes one",
        "a caller that builds its argument from tuples gets the same answer instead of a "
        "TypeError deep inside os.path.commonprefix",
    ),
)
"""Every option, in SPEC.md's order."""

#: prefixcache's rule for every option (the default).
PREFIXCACHE = Semantics()

PRESETS: Dict[str, Semantics] = {
    "prefixcache": PREFIXCACHE,
    "vllm-0.8.5": Semantics(computed_on_release=True, failed_query_counted=True,
                            any_mistake_exception=True, lists_only=True),
}
"""The named sets of values: ``prefixcache`` (the default) and ``vllm-0.8.5``."""

DEFAULT = "prefixcache"


def preset(name: str) -> Semantics:
    """The preset called ``name`` (ValueError naming the presets otherwise)."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown semantics {name!r}; choose one of {sorted(PRESETS)}") from None


def option_named(name: str) -> Option:
    """The option called ``name`` (KeyError otherwise)."""
    return {option.name: option for option in OPTIONS}[name]
