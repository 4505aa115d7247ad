"""``kvcore.testing.check_plugin``: check an attention type the way kvcore checks its own.

The rules are listed in :func:`check_plugin`'s docstring (the public
documentation). Each failure raises :class:`ConformanceError` naming the
rule, the classes and a reproducible case.
"""

from __future__ import annotations

import math
import pickle
import random
import sys
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import attrs

from kvcore._block_pool import NULL_BLOCK, BlockPool
from kvcore._config import KVCacheConfig, PagePool
from kvcore._kv_cache_manager import KVCacheManager
from kvcore._plugin_types import LayerType
from kvcore._registry import Registry, registry_from_layer_types
from kvcore._workload import RandomWorkload, snapshot
from kvcore.errors import InvalidConfigError, InvalidSpecError, KVCoreError
from kvcore.managers import CachedBlockLookup, HitQuery, SingleTypeManager
from kvcore.specs import AttentionSpec, KVCacheSpec, TokenLimits

__all__ = ["ConformanceError", "ConformanceReport", "check_plugin"]

#: Longest request of the workloads, in tokens.
MAX_MODEL_LEN = 1024
#: Steps starting at each position below this are checked against tokens_read.
POSITIONS_READ_STARTS = 200


class ConformanceError(AssertionError):
    """A rule of :func:`check_plugin` is broken; the message names the rule and the case."""

    def __init__(self, rule: str, subject: str, detail: str) -> None:
        super().__init__(f"check_plugin rule {rule!r} failed for {subject}: {detail}")
        self.rule = rule


@attrs.frozen(kw_only=True)
class ConformanceReport:
    """What :func:`check_plugin` checked.

    Attributes:
        spec: The spec checked.
        manager: Its manager class.
        passed: The rules that held, in order.
        skipped: ``(rule, reason)`` for the rules that do not apply.
        hit_cases: Cache states on which the hit search was compared.
        workload_ops: Workload operations run in all.
    """

    spec: KVCacheSpec
    manager: type[SingleTypeManager[Any]]
    passed: tuple[str, ...]
    skipped: tuple[tuple[str, str], ...]
    hit_cases: int
    workload_ops: int


class _DictLookup(CachedBlockLookup):
    """Cached blocks in a dictionary per group: the lookup protocol without a pool."""

    def __init__(self, cached: list[dict[Hashable, int]]) -> None:
        self.cached = cached

    def get_cached_block(
        self, block_hash: Hashable, kv_cache_group_ids: Sequence[int]
    ) -> list[int] | None:
        found = []
        for group in kv_cache_group_ids:
            block = self.cached[group].get(block_hash)
            if block is None:
                return None
            found.append(block)
        return found


@attrs.define
class _Checker:
    spec: KVCacheSpec
    registry: Registry
    partner: KVCacheSpec | None
    seed: int
    num_ops: int
    manager: type[SingleTypeManager[Any]] = attrs.field(init=False)
    passed: list[str] = attrs.field(factory=list)
    skipped: list[tuple[str, str]] = attrs.field(factory=list)
    hit_cases: int = 0
    workload_ops: int = 0

    @property
    def subject(self) -> str:
        return f"{type(self.spec).__qualname__} (managed by {self.manager.__qualname__})"

    def fail(self, rule: str, detail: str) -> ConformanceError:
        return ConformanceError(rule, self.subject, detail)

    def run(self, rule: str, check: Callable[[], str | None]) -> None:
        """Check one rule; whatever the plugin's code raises fails that rule, by name."""
        try:
            reason = check()
        except ConformanceError:
            raise
        except Exception as exc:
            raise self.fail(rule, f"the plugin's code raised {type(exc).__name__}: {exc}") from exc
        if reason is None:
            self.passed.append(rule)
        else:
            self.skipped.append((rule, reason))

    # -- static rules -------------------------------------------------------------------

    def tokens_read(self) -> None:
        spec = self.spec
        for position in range(3 * MAX_MODEL_LEN // 2):
            ranges = spec.tokens_read(position)
            previous = 0
            for read in ranges:
                if not isinstance(read, range) or read.step != 1:
                    raise self.fail(
                        "tokens_read", f"tokens_read({position}) gave {read!r}, not a range"
                    )
                if read.start < previous or read.stop > position or read.start > read.stop:
                    raise self.fail(
                        "tokens_read",
                        f"tokens_read({position}) = {ranges!r}: ranges must be increasing, "
                        f"disjoint and below the position",
                    )
                previous = read.stop
        self._positions_read()

    def _positions_read(self) -> None:
        """A query reads only what it keeps; a step reads the union of its queries' reads."""
        spec = self.spec
        single = [spec.positions_read(p) for p in range(POSITIONS_READ_STARTS + 40)]
        for position, reads in enumerate(single):
            kept = {t for r in spec.tokens_read(position) for t in r}
            if any(t not in kept for r in reads for t in r):
                raise self.fail(
                    "tokens_read",
                    f"positions_read({position}) = {reads!r} reads a position that "
                    f"tokens_read({position}) = {spec.tokens_read(position)!r} does not keep",
                )
        for start in range(POSITIONS_READ_STARTS):
            for stop in (start + 1, start + 7, start + 40):
                covered = sorted(
                    {t for p in range(start, stop) for r in single[p] for t in r if t < start}
                )
                got = spec.positions_read(start, stop)
                if [t for r in got for t in r] != covered or any(len(r) == 0 for r in got):
                    raise self.fail(
                        "tokens_read",
                        f"positions_read({start}, {stop}) = {got!r}, but its queries read "
                        f"{_describe_positions(covered)} before {start} (positions_read of each)",
                    )

    def skipped_tokens(self, manager: SingleTypeManager[Any]) -> None:
        before = 0
        for n in range(1, 3 * MAX_MODEL_LEN // 2):
            skipped = manager.get_num_skipped_tokens(n)
            if skipped < before:
                raise self.fail(
                    "skipped_tokens",
                    f"get_num_skipped_tokens({n}) = {skipped} < get_num_skipped_tokens({n - 1}) "
                    f"= {before}: blocks freed earlier would be needed again",
                )
            before = skipped
            first_read = min((r.start for r in self.spec.tokens_read(n) if len(r)), default=n)
            if skipped > first_read:
                raise self.fail(
                    "skipped_tokens",
                    f"get_num_skipped_tokens({n}) = {skipped}, but the query at {n} reads token "
                    f"{first_read} (tokens_read); freed blocks would still be read",
                )

    def page(self) -> None:
        spec = self.spec
        if attrs.evolve(spec) != spec or hash(attrs.evolve(spec)) != hash(spec):
            raise self.fail("page", "an equal copy of the spec compares or hashes differently")
        if _importable(type(spec)):
            if pickle.loads(pickle.dumps(spec)) != spec:
                raise self.fail("page", "the spec does not survive pickling unchanged")
        else:
            self.skipped.append(("page[pickle]", "the spec class is not importable by its name"))
        self._format_page()
        end = max(part.end for part in spec.page_parts())
        if end != spec.real_page_size_bytes or spec.page_size_bytes < end:
            raise self.fail(
                "page",
                f"page parts end at byte {end}, real page {spec.real_page_size_bytes}, page "
                f"{spec.page_size_bytes}",
            )
        self._base_checks_run()
        self._page_grows_with_block_size()
        page = spec.page_size_bytes
        if spec.grown_to_page(page) != spec:
            raise self.fail("page", f"grown_to_page({page}) (its own page) changed the spec")
        for target in (2 * page, 3 * page, page + spec.block_size):
            try:
                grown = spec.grown_to_page(target)
            except InvalidSpecError:
                continue
            if grown is not None and grown.page_size_bytes != target:
                raise self.fail(
                    "page",
                    f"grown_to_page({target}) returned a {grown.page_size_bytes}-byte page; it "
                    "must return the page asked for, or None",
                )
        previous = 0
        for length in (1, spec.block_size, 100, 1000, 10_000):
            limits = TokenLimits(max_model_len=length, max_num_encoder_tokens=length)
            bound = spec.max_memory_usage_bytes(limits)
            if type(bound) is not int or bound < previous or bound % spec.page_size_bytes:
                raise self.fail(
                    "page",
                    f"max_memory_usage_bytes(max_model_len={length}) = {bound!r}: it must be a "
                    f"whole number of {spec.page_size_bytes}-byte pages, never shrinking as "
                    "max_model_len grows",
                )
            previous = bound

    def _format_page(self) -> None:
        """A spec whose dtype is a KV format has exactly the format's page parts."""
        spec = self.spec
        if not isinstance(spec, AttentionSpec) or spec.kv_format is None:
            return
        expected = spec.kv_format.page_parts(
            block_size=spec.block_size,
            num_kv_heads=spec.num_kv_heads,
            head_size=spec.head_size,
            head_size_v=spec.head_size_v,
        )
        if spec.page_parts() != expected:
            raise self.fail(
                "page",
                f"its dtype is the KV format {spec.kv_format.name!r}, but page_parts() gives "
                f"{spec.page_parts()!r}, not the format's {expected!r}; a format describes the "
                "page: derive the parts from KVFormat.page_parts",
            )

    def _base_checks_run(self) -> None:
        """The base class's ``__attrs_post_init__`` runs: a too-small padding is refused."""
        spec = self.spec
        too_small = spec.real_page_size_bytes - 1
        if too_small < 1:
            return
        try:
            attrs.evolve(spec, page_size_padded=too_small)
        except InvalidSpecError:
            return
        raise self.fail(
            "page",
            f"a copy with page_size_padded={too_small} (below its {spec.real_page_size_bytes}"
            f"-byte page) was accepted: {type(spec).__qualname__}.__attrs_post_init__ does not "
            "call super().__attrs_post_init__(), so kvcore's own checks of the spec never run",
        )

    def _page_grows_with_block_size(self) -> None:
        """An attention page holds ``block_size`` tokens: every part doubles with it."""
        spec = self.spec
        if not isinstance(spec, AttentionSpec):
            return
        try:
            double = attrs.evolve(spec, block_size=2 * spec.block_size)
        except InvalidSpecError:
            return
        for part, grown in zip(spec.page_parts(), double.page_parts(), strict=False):
            size, grown_size = part.end - part.offset, grown.end - grown.offset
            if grown_size != 2 * size:
                raise self.fail(
                    "page",
                    f"page part {part.name!r} is {size} bytes at block_size={spec.block_size} "
                    f"and {grown_size} at block_size={double.block_size}: an attention page "
                    "holds block_size tokens, so each part's shape must grow with it "
                    "(tokens past the first block would overwrite the next block)",
                )

    def _variants(self) -> list[KVCacheSpec]:
        """Specs of the type differing from the spec in one integer field."""
        variants = []
        for field in attrs.fields(type(self.spec)):
            value = getattr(self.spec, field.name)
            if type(value) is not int or field.name == "block_size":
                continue
            for other in (value * 2, value + self.spec.block_size, value * 3):
                if other == value:
                    continue
                try:
                    variants.append(attrs.evolve(self.spec, **{field.name: other}))
                except (InvalidSpecError, TypeError, ValueError):
                    continue
                break
        return variants

    def grouping_key(self) -> None:
        spec = self.spec
        try:
            hash(spec.uniform_type_key)
        except TypeError as exc:
            raise self.fail("grouping_key", f"uniform_type_key is not hashable: {exc}") from exc
        if type(spec).merge([spec, attrs.evolve(spec)]) != spec:
            raise self.fail("grouping_key", "merge of two equal specs is not the spec")
        positions = range(0, 3 * MAX_MODEL_LEN // 2, 7)
        own = [spec.tokens_read(p) for p in positions]
        for variant in self._variants():
            if variant.uniform_type_key != spec.uniform_type_key:
                continue
            if [variant.tokens_read(p) for p in positions] != own:
                raise self.fail(
                    "grouping_key",
                    f"{variant!r} has the uniform_type_key of {spec!r} but reads other tokens: "
                    "planning would give both one block table. Include the field in "
                    "uniform_type_key (or leave it out of page_only_fields)",
                )

    # -- the hit search against a brute-force oracle -------------------------------------

    def _accepts(self, *, use_eagle: bool, alignment: int) -> bool:
        try:
            self.manager.validate_config(
                self.spec, enable_caching=True, use_eagle=use_eagle, alignment_tokens=alignment
            )
        except InvalidConfigError:
            return False
        return True

    def _oracle(
        self,
        cached: list[set[int]],
        max_length: int,
        use_eagle: bool,
        alignment: int,
    ) -> int:
        bs = self.spec.block_size
        drops = use_eagle and self.manager.eagle_drops_last_block

        def cached_everywhere(block: int) -> bool:
            return all(block in group for group in cached)

        def usable(length: int) -> bool:
            blocks = {t // bs for r in self.spec.tokens_read(length) for t in r}
            return all(cached_everywhere(b) for b in blocks)

        step = math.lcm(alignment, bs)
        for length in range(max_length - max_length % step, 0, -step):
            if not usable(length):
                continue
            if drops and (
                (length // bs + 1) * bs > max_length or not cached_everywhere(length // bs)
            ):
                continue
            return length
        return 0

    def hit_search(self) -> str | None:
        if not self.manager.supports_prefix_caching:
            return "the type is never prefix-cached"
        rng = random.Random(self.seed)
        bs = self.spec.block_size
        settings = [
            (eagle, align * bs)
            for eagle in (False, True)
            for align in (1, 2, 3)
            if self._accepts(use_eagle=eagle, alignment=align * bs)
        ]
        if not settings:
            return "validate_config refuses prefix caching at every alignment tried"
        for case in range(400):
            num_blocks = rng.randint(1, 40)
            num_groups = 1 if case % 3 else 2
            density = rng.choice((0.3, 0.7, 0.95, 1.0))
            hashes = [f"h{case}.{i}" for i in range(num_blocks)]
            cached_sets: list[set[int]] = []
            maps: list[dict[Hashable, int]] = []
            next_block = 1
            for _ in range(num_groups):
                positions = {i for i in range(num_blocks) if rng.random() < density}
                cached_sets.append(positions)
                mapping: dict[Hashable, int] = {}
                for i in sorted(positions):
                    mapping[hashes[i]] = next_block
                    next_block += 1
                maps.append(mapping)
            use_eagle, alignment = rng.choice(settings)
            max_length = rng.randint(0, num_blocks * bs)
            query: HitQuery[Any] = HitQuery(
                hashes,
                max_length,
                list(range(num_groups)),
                _DictLookup(maps),
                self.spec,
                use_eagle,
                alignment,
            )
            got = self.manager.find_longest_cache_hit(query)
            expected = self._oracle(cached_sets, max_length, use_eagle, alignment)
            where = (
                f"case {case}: cached positions per group {[sorted(s) for s in cached_sets]} "
                f"of {num_blocks} blocks of {bs} tokens, max_length {max_length}, use_eagle "
                f"{use_eagle}, alignment {alignment}"
            )
            if len(got) != num_groups or len({len(blocks) for blocks in got}) != 1:
                raise self.fail(
                    "hit_search", f"{where}: returned {got!r}, not one list per group of one length"
                )
            length = len(got[0]) * bs
            if length != expected:
                raise self.fail(
                    "hit_search",
                    f"{where}: the hit is {length} tokens, but the longest usable one by the "
                    f"type's tokens_read rule is {expected}",
                )
            read = {t // bs for r in self.spec.tokens_read(length) for t in r}
            for group, blocks in enumerate(got):
                for i, block in enumerate(blocks):
                    cached_block = maps[group].get(hashes[i])
                    if block != NULL_BLOCK and block != cached_block:
                        raise self.fail(
                            "hit_search",
                            f"{where}: block {i} of group {group} is {block}, not the block "
                            f"cached for its hash ({cached_block})",
                        )
                    if i in read and block == NULL_BLOCK:
                        raise self.fail(
                            "hit_search",
                            f"{where}: block {i} of group {group} is read at {length} but the "
                            "hit gives the null block",
                        )
            self.hit_cases += 1
        return None

    # -- workloads ----------------------------------------------------------------------

    def _manager(
        self,
        specs: list[KVCacheSpec],
        *,
        caching: bool,
        eagle: bool,
        registry: Registry | None = None,
        two_level: bool = False,
    ) -> KVCacheManager:
        reserved = sum(s.pool_reserved_blocks for s in specs)
        per_request = -(-MAX_MODEL_LEN // min(s.block_size for s in specs)) + 2
        num_blocks = 3 * per_request * len(specs) + reserved + 1
        config = KVCacheConfig.from_specs(num_blocks, specs)
        if two_level:
            config = _carved(config, 3 * per_request + reserved)
        return KVCacheManager(
            config,
            MAX_MODEL_LEN,
            registry=registry or self.registry,
            enable_caching=caching,
            use_eagle=eagle,
        )

    def _workload(
        self, rule: str, specs: list[KVCacheSpec], group: int, *, two_level: bool = False
    ) -> str | None:
        encoder = self.manager.allocates_for_encoder
        cacheable = self.manager.is_prefix_cacheable(self.spec) and all(
            self.registry.manager_class(s).is_prefix_cacheable(s) for s in specs
        )
        runs = 0
        for eagle in (False, True):
            try:
                manager = self._manager(specs, caching=cacheable, eagle=eagle, two_level=two_level)
            except KVCoreError:
                if not eagle:
                    raise
                continue  # the type refuses EAGLE (validate_config)
            workload = RandomWorkload(
                manager,
                seed=self.seed + runs,
                prompt_lengths=(1, MAX_MODEL_LEN // 2),
                max_output=MAX_MODEL_LEN // 8,
                num_encoder_tokens=64 if encoder else 0,
            )
            limits = TokenLimits(max_model_len=MAX_MODEL_LEN, max_num_encoder_tokens=64)
            bound = self.spec.max_memory_usage_bytes(limits) // self.spec.page_size_bytes
            group_manager = manager.coordinator.managers[group]
            for op in range(self.num_ops):
                try:
                    workload.step()
                except AssertionError as exc:
                    raise self.fail(rule, f"use_eagle={eagle}, operation {op}: {exc}") from exc
                if not encoder:
                    self._check_reads(rule, workload.running, group_manager, eagle, op, bound)
            workload.run(0)
            self.workload_ops += self.num_ops
            runs += 1
        if not cacheable:
            self.skipped.append((f"{rule}[prefix caching]", "the group is never prefix-cached"))
        return None

    def steady_until(self) -> str | None:
        """A decode step the manager's steady_until skips changes nothing the full route would.

        The same random traffic drives two managers: one of the type's
        class, one of a subclass whose steady_until sends every step the full
        way. After every operation both must hold exactly the same state.
        """
        full_route = type(
            f"FullRoute{self.manager.__name__}",
            (self.manager,),
            {"steady_until": _every_step_changes},
        )
        records = [
            LayerType(t.spec, full_route) if t.spec is type(self.spec) else t
            for t in self.registry.layer_types
        ]
        slow_registry = registry_from_layer_types(records, name="full-route")
        cacheable = self.manager.is_prefix_cacheable(self.spec)
        managers = [
            self._manager([self.spec], caching=cacheable, eagle=False, registry=registry)
            for registry in (self.registry, slow_registry)
        ]
        workloads = [
            RandomWorkload(
                manager,
                seed=self.seed,
                prompt_lengths=(1, MAX_MODEL_LEN // 2),
                max_output=MAX_MODEL_LEN // 8,
                num_encoder_tokens=64 if self.manager.allocates_for_encoder else 0,
            )
            for manager in managers
        ]
        for op in range(self.num_ops):
            for workload in workloads:
                workload.step()
            if snapshot(managers[0]) != snapshot(managers[1]):
                raise self.fail(
                    "steady_until",
                    f"operation {op}: the manager skipped a decode step (within its "
                    "steady_until) that the full route would have changed something in; "
                    "steady_until must not reach past the next allocation, caching or free",
                )
        return None

    def _check_reads(
        self,
        rule: str,
        running: Sequence[Any],
        group_manager: SingleTypeManager[Any],
        eagle: bool,
        op: int,
        bound: int,
    ) -> None:
        bs = self.spec.block_size
        for request in running:
            table = group_manager.req_to_blocks.get(request.request_id, [])
            held = sum(1 for block in table if block)
            if held > bound:
                raise self.fail(
                    rule,
                    f"use_eagle={eagle}, operation {op}: request {request.request_id!r} holds "
                    f"{held} blocks, more than max_memory_usage_bytes allows ({bound})",
                )
            position = request.num_computed_tokens
            for read in self.spec.tokens_read(position):
                for block in range(read.start // bs, -(-read.stop // bs)):
                    if block >= len(table) or not table[block]:
                        raise self.fail(
                            rule,
                            f"use_eagle={eagle}, operation {op}: request {request.request_id!r} "
                            f"at token {position} reads tokens {read.start}-{read.stop - 1}, but "
                            f"block {block} of its table is "
                            f"{'missing' if block >= len(table) else 'freed (null)'}",
                        )

    # -- torch --------------------------------------------------------------------------

    def torch_views(self) -> str | None:
        from kvcore._planning.allocate import allocate_kv_cache
        from kvcore._planning.grouping import get_kv_cache_groups
        from kvcore._planning.sizing import get_kv_cache_config

        layouts: list[dict[str, KVCacheSpec]] = [{"a": self.spec, "b": self.spec}]
        if self.partner is not None:
            layouts.append({"partner": self.partner, "a": self.spec})
        for layer_specs in layouts:
            groups = None
            for layout in ("layer_outer", "block_outer"):
                try:
                    groups = get_kv_cache_groups(layer_specs, layout=layout)
                except InvalidConfigError:
                    continue
                break
            if groups is None:
                raise self.fail("torch_views", f"{sorted(layer_specs)} cannot be grouped")
            per_block = sum(g.kv_cache_spec.page_size_bytes * len(g.layer_names) for g in groups)
            config = get_kv_cache_config(groups, 64 * per_block, num_blocks=16)
            buffers = allocate_kv_cache(config)
            spec = config.layer_spec("a")
            views = buffers.views["a"]
            parts = spec.page_parts()
            if len(views) != len(parts):
                raise self.fail("torch_views", f"{len(views)} views for {len(parts)} page parts")
            for view, part in zip(views, parts, strict=True):
                if tuple(view.shape) != (config.num_blocks, *part.shape):
                    raise self.fail(
                        "torch_views",
                        f"part {part.name!r} has shape {tuple(view.shape)}, expected "
                        f"{(config.num_blocks, *part.shape)}",
                    )
                if str(view.dtype).removeprefix("torch.") != part.dtype:
                    raise self.fail("torch_views", f"part {part.name!r} has dtype {view.dtype}")
                view[1].fill_(1)
                if bool(view[0].any()) or bool(view[2].any()):
                    raise self.fail(
                        "torch_views",
                        f"writing block 1 of part {part.name!r} changed another block's bytes",
                    )
                view.zero_()
        return None

    # -- driver -------------------------------------------------------------------------

    def check(self) -> ConformanceReport:
        try:
            self.manager = self.registry.manager_class(self.spec)
        except KVCoreError as exc:
            self.manager = SingleTypeManager
            raise self.fail("registered", str(exc)) from exc
        self.passed.append("registered")
        self.run("tokens_read", lambda: self.tokens_read())
        self.run(
            "skipped_tokens",
            lambda: self.skipped_tokens(
                self.manager(self.spec, BlockPool(self.spec.pool_reserved_blocks + 2))
            ),
        )
        self.run("page", lambda: self.page())
        self.run("grouping_key", lambda: self.grouping_key())
        self.run("hit_search", self.hit_search)
        self.run("workload", lambda: self._workload("workload", [self.spec], 0))
        self.run("steady_until", self.steady_until)
        if self.partner is None:
            self.skipped.append(("hybrid_workload", "no type that keeps every token to pair with"))
        else:
            partner = self.partner
            self.run(
                "hybrid_workload",
                lambda: self._workload("hybrid_workload", [partner, self.spec], 1),
            )
            other = _other_page(partner, self.spec)
            self.run(
                "two_level_workload",
                lambda: self._workload("two_level_workload", [other, self.spec], 1, two_level=True),
            )
        self.run("torch_views", self.torch_views)
        return ConformanceReport(
            spec=self.spec,
            manager=self.manager,
            passed=tuple(self.passed),
            skipped=tuple(self.skipped),
            hit_cases=self.hit_cases,
            workload_ops=self.workload_ops,
        )


def _other_page(partner: KVCacheSpec, spec: KVCacheSpec) -> KVCacheSpec:
    """``partner`` with a page of another size than ``spec``'s (twice the heads if equal)."""
    if partner.page_size_bytes != spec.page_size_bytes or not isinstance(partner, AttentionSpec):
        return partner
    return attrs.evolve(partner, num_kv_heads=2 * partner.num_kv_heads)


def _carved(config: KVCacheConfig, pages_per_class: int) -> KVCacheConfig:
    """``config`` with a two-level pool: one class per page size, large pages of their LCM.

    ``pages_per_class`` large pages' worth of memory for each class's blocks.
    """
    sizes = sorted({g.kv_cache_spec.page_size_bytes for g in config.kv_cache_groups})
    large = math.lcm(*sizes)
    num_large = 1 + sum(
        -(
            -pages_per_class
            * sum(1 for g in config.kv_cache_groups if g.kv_cache_spec.page_size_bytes == size)
            // (large // size)
        )
        for size in sizes
    )
    pool = PagePool(
        large_page_bytes=large,
        num_large_pages=num_large,
        class_page_bytes=tuple(sizes),
        group_classes=tuple(
            sizes.index(g.kv_cache_spec.page_size_bytes) for g in config.kv_cache_groups
        ),
    )
    return attrs.evolve(config, num_blocks=num_large, page_pool=pool)


def _every_step_changes(
    manager: SingleTypeManager[Any], request_id: str, num_computed_tokens: int
) -> int:
    """A steady_until that sends every step the full way (always correct)."""
    return num_computed_tokens


def _describe_positions(positions: list[int]) -> str:
    """The ``range`` runs of sorted positions, for messages."""
    runs: list[range] = []
    for position in positions:
        if runs and position == runs[-1].stop:
            runs[-1] = range(runs[-1].start, position + 1)
        else:
            runs.append(range(position, position + 1))
    return ", ".join(map(repr, runs)) or "(none)"


def _importable(cls: type) -> bool:
    """Whether pickle can find ``cls`` again (a module-level class of an importable module)."""
    target: Any = sys.modules.get(cls.__module__)
    for part in cls.__qualname__.split("."):
        target = getattr(target, part, None)
    return target is cls


def _default_partner(spec: KVCacheSpec, registry: Registry) -> KVCacheSpec | None:
    """A spec of the first registered type that keeps every token and takes plain fields."""
    for layer_type in registry.layer_types:
        cls = layer_type.spec
        if (
            cls is type(spec)
            or not cls.attends_to_all_tokens
            or cls.keeps_own_group
            or not layer_type.manager.downward_closed_hits
            or not issubclass(cls, AttentionSpec)
        ):
            continue
        try:
            return cls(block_size=spec.block_size, num_kv_heads=1, head_size=8, dtype="float16")
        except (TypeError, KVCoreError):
            continue
    return None


def check_plugin(
    spec: KVCacheSpec,
    *,
    registry: Registry | None = None,
    partner: KVCacheSpec | None = None,
    seed: int = 0,
    num_ops: int = 300,
) -> ConformanceReport:
    """Check an attention type against every rule kvcore's own types pass.

    Run it from your plugin's tests with specs as your users would make them
    (one per configuration worth checking: a window, a chunk, a cache mode).
    The rules, checked in this order; the first one broken raises
    :class:`ConformanceError` naming it and a reproducible case (an exception
    the plugin's own code raises while a rule is checked, from its spec,
    manager or hit search, fails that rule the same way, chained to it):

    ``registered``
        The spec's class is served by the registry (which checked the classes
        against the plugin contract when it was built).
    ``tokens_read``
        :meth:`~kvcore.specs.KVCacheSpec.tokens_read` gives increasing, disjoint
        ranges of earlier tokens.
    ``skipped_tokens``
        :meth:`~kvcore.managers.SingleTypeManager.get_num_skipped_tokens` never
        decreases and never covers a token the next query reads.
    ``page``
        The page: a value object (equal copies hash alike, survive pickling),
        exactly the parts of its :class:`~kvcore.specs.KVFormat` when its
        ``dtype`` is one, parts inside the page, kvcore's own checks of a spec
        run (a subclass's ``__attrs_post_init__`` calls
        ``super().__attrs_post_init__()``), for an attention spec every part
        growing with the block size, ``grown_to_page`` keeping or reaching the
        page asked for, a positive memory bound that is a whole number of
        pages and grows with ``max_model_len``.
    ``grouping_key``
        Two specs of the type with equal
        :attr:`~kvcore.specs.KVCacheSpec.uniform_type_key` read the same tokens
        (else planning could put them in one block table), and ``merge`` of
        equal specs is the spec.
    ``hit_search``
        On random cache states (held by a plain dictionary behind the
        :class:`~kvcore.managers.CachedBlockLookup` protocol, not a block pool),
        with one and two groups, several alignments and EAGLE where the type
        accepts it, the hit equals the longest one a brute-force search finds
        from the type's own rule: a hit of ``L`` tokens is usable when every
        block holding a token read at position ``L`` is cached (with EAGLE, the
        block after the hit too), and its blocks are the cached ones (or null
        where nothing is read).
    ``workload`` / ``hybrid_workload``
        :class:`~kvcore.testing.RandomWorkload` drives a manager with the type
        alone and next to a type that keeps every token (with and without
        EAGLE where accepted): allocations take what they predicted, refusals
        change nothing, hits are aligned, no block a request still reads was
        freed, and no request holds more blocks than the memory bound allows.
    ``two_level_workload``
        The same next to a type whose pages have another size, in a two-level
        pool (each page size its own class, carved from shared large pages):
        every invariant of the pool and its large pages holds after every
        operation, with memory moving between the classes.
    ``steady_until``
        The same random traffic on a manager of the type's class and on one
        whose :meth:`~kvcore.managers.SingleTypeManager.steady_until` sends
        every decode step the full way leaves both in exactly the same state
        after every operation: the decode steps the manager skips change
        nothing.
    ``torch_views``
        The spec planned alone and next to the partner type allocates with
        :func:`kvcore.allocate_kv_cache`: one view per page part, of its shape
        and dtype, each block's bytes its own.

    Args:
        spec: A spec of the type.
        registry: The plugins serving the spec and the partner (default:
            :func:`kvcore.load_registry`, every installed plugin).
        partner: A spec of a type that keeps every token, for the hybrid
            workload and planning; default: the first registered such type
            that can be built from block size, heads, head size and dtype (full
            attention, when it is installed).
        seed: Seed of the random cache states and workloads.
        num_ops: Workload operations per run.

    Returns:
        What was checked (rules passed, rules skipped with the reason).

    Raises:
        ConformanceError: (an ``AssertionError``) a rule is broken.
    """
    if registry is None:
        from kvcore._plugin_loader import load_registry

        registry = load_registry()
    if partner is None:
        partner = _default_partner(spec, registry)
    return _Checker(spec, registry, partner, seed, num_ops).check()
