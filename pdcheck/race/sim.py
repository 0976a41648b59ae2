"""The simulated executor around vLLM's real scheduler: explicit, deterministic steps and a shadow-memory check.

Ordering model (why the races are reachable): like ``EngineCore.step_with_batch_queue``, a step is
dispatched while up to ``depth - 1`` older steps are still in flight, and step S runs on the
simulated GPU only when it leaves the queue, after S+1 was dispatched. Within a step, zeroing
comes first, then CoW copies, KV writes, Mamba state reads/writes, then attention reads. An RDMA
load lands at a random execution between the dispatch of the step that started it and the step
whose output reports it, so it can land before an older in-flight step runs.

Invariants checked after every execution (findings are data, never asserts): a stale step never
writes a block the scheduler has given to another request (hazard); a live request reads only its
own KV and state (corruption). Reads by in-flight steps of requests that already finished or were
preempted are not checked: their outputs are discarded.
"""

from __future__ import annotations

import collections
import dataclasses
import random
from collections.abc import Callable

from pdcheck._vllm.records import LoadStart, ScheduledRequest, StepRecord
from pdcheck._vllm.sim_scheduler import SimScheduler
from pdcheck.errors import HarnessError
from pdcheck.race.findings import FAMILY, Finding, Kind, Reproducer
from pdcheck.race.shadow import GARBLE, POISON, ZERO, ShadowMemory, prefix_tags, state_tag
from pdcheck.race.workload import SimRequest, Workload, generate_requests

MAX_FINDINGS_KEPT = 20


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclasses.dataclass
class PendingLoad:
    load: LoadStart
    step: int  # dispatch index of the step that started it
    land_at: int  # execution index before which it lands
    report_at: int  # execution index whose output reports it
    valid_blocks: (
        int | None
    )  # None: every block lands; k: only the first k attention blocks (then reported failed)
    # With no older step in flight, the own step's zeroing runs on an idle stream before the RDMA
    # can land (why synchronous scheduling has no zeroing race).
    after_zeroing: bool = False
    landed: bool = False


@dataclasses.dataclass
class _InFlight:
    record: StepRecord
    dispatch_index: int


class RaceSim:
    """One seed of one workload: drives a SimScheduler and checks shadow memory. Call ``run()``."""

    def __init__(
        self, workload: Workload, seed: int, scheduler: SimScheduler, *, replay_options: str = ""
    ) -> None:
        self.workload = workload
        self.replay_options = replay_options
        self.seed = seed
        self.rng = random.Random(seed)
        self.sched = scheduler
        self.attn_groups = [i for i, g in enumerate(scheduler.groups) if g.kind == "attention"]
        self.mamba_groups = [
            (i, g.block_size) for i, g in enumerate(scheduler.groups) if g.kind == "mamba"
        ]
        self.bs = workload.scheduler.block_size
        self.memory = ShadowMemory(workload.scheduler.num_blocks + 1, self.bs)
        self.pending_requests = collections.deque(generate_requests(workload, self.rng))
        self.requests: dict[str, SimRequest] = {}
        self.tags: dict[str, list[int]] = {}
        self.queue: collections.deque[_InFlight] = collections.deque()
        self.loads: dict[str, PendingLoad] = {}
        self.load_blocks: dict[str, set[int]] = {}  # loader -> blocks its load writes
        self.own_blocks: dict[str, set[int]] = collections.defaultdict(set)
        self.verified: dict[tuple[str, int], dict[int, tuple[int, int]]] = collections.defaultdict(
            dict
        )
        self.dispatched = 0
        self.executed = 0
        self.live_count = 0
        self.findings: list[Finding] = []  # the first MAX_FINDINGS_KEPT, with reproducers
        self.num_findings = 0
        self.kind_counts: collections.Counter[str] = (
            collections.Counter()
        )  # every finding, kept or not
        self.num_propagated = 0
        # family -> dispatch index of its first finding, over every finding (kept or not)
        self.first_step_by_family: dict[str, int] = {}
        self._seen: set[tuple] = set()
        self.log: list[
            tuple[int, str, frozenset[str]]
        ] = []  # (dispatch index, line, request ids involved)
        self.timelines: dict[int, list[str]] = collections.defaultdict(list)
        self._known_blocks: dict[str, set[int]] = collections.defaultdict(set)
        self._owners: dict[int, list[str]] | None = None
        self._incarnations: dict[str, int] = {}
        self._assigned_at: dict[
            tuple[str, int], int
        ] = {}  # (request, block) -> dispatch index that gave it
        self._exec_of_dispatch: dict[int, int] = {}  # dispatch index -> execution index
        self._landed_exec: dict[str, int] = {}  # loader -> execution index its load landed at
        # block -> (dispatch index that started the last load written into it, execution index it landed at)
        self._block_loaded: dict[int, tuple[int, int]] = {}
        self._preempted_at: dict[str, int] = {}  # request -> dispatch index of its last preemption
        self._poison_kind: dict[
            str, Kind
        ] = {}  # request -> the finding that poisoned its Mamba state

    # ---- driver ---------------------------------------------------------------------------
    def run(self) -> list[Finding]:
        depth = self.workload.scheduler.depth
        while self.dispatched < self.workload.max_steps:
            self._arrivals()
            if self.workload.abort_rate and self.rng.random() < self.workload.abort_rate:
                self._abort_random()
            if self.sched.has_requests() and len(self.queue) < depth:
                self.dispatch()
                if len(self.queue) < depth:
                    continue
            if self.queue:
                self.execute()
            elif self.pending_requests:
                self.add_request(
                    self.pending_requests.popleft()
                )  # nothing in flight: let traffic in
            else:
                return self.findings
        raise HarnessError(
            f"{self.workload.name} seed {self.seed} did not drain within max_steps={self.workload.max_steps}: "
            f"{len(self.pending_requests)} requests not yet sent; raise max_steps or check the scheduler is not stuck"
        )

    def _arrivals(self) -> None:
        target = 2 * self.workload.scheduler.max_num_seqs
        while self.pending_requests and self.live_count < target:
            self.add_request(self.pending_requests.popleft())

    def _abort_random(self) -> None:
        live = [
            rid for rid in self.requests if self.sched.is_live(rid, self._incarnations.get(rid, 0))
        ]
        if live:
            self.abort(self.rng.choice(sorted(live)))

    # ---- step methods ---------------------------------------------------------------------
    def add_request(self, req: SimRequest) -> None:
        self.requests[req.request_id] = req
        self.tags[req.request_id] = prefix_tags(req.tokens)
        self.live_count += 1
        self.sched.add_request(
            req.request_id,
            list(req.tokens[: req.prompt_len]),
            max_tokens=req.max_tokens,
            eos_token_id=0,
            remote=req.remote,
        )
        self._log(
            f"sim.add_request({req.request_id!r}, prompt_len={req.prompt_len}, max_tokens={req.max_tokens}, remote={req.remote})",
            {req.request_id},
        )

    def abort(self, rid: str) -> None:
        if self.sched.abort(rid):
            self._finished(rid, "abort")
            self._log(f"sim.abort({rid!r})", {rid})

    def dispatch(self) -> None:
        record = self.sched.schedule()
        self.dispatched += 1
        self._owners = None
        index = self.dispatched
        self.queue.append(_InFlight(record, index))
        for rid in record.preempted_ids:
            self._released(rid, "preempted")
        for entry in record.requests:
            self._incarnations[entry.request_id] = entry.incarnation
            self._assign(entry.request_id, entry.block_ids, index)
        own_exec = self.executed + len(self.queue)
        for load in record.loads:
            self._start_load(load, index, own_exec)
        if record.zero_block_ids:
            self._check_zeroing_targets(record, index)
        parts = " ".join(
            f"{e.request_id}[{e.start}:{e.start + e.num_tokens}]" for e in record.requests
        )
        loads = " ".join(f"load:{ld.request_id}{list(ld.block_ids)}" for ld in record.loads)
        zero = f" zero={list(record.zero_block_ids)}" if record.zero_block_ids else ""
        involved = {e.request_id for e in record.requests} | {ld.request_id for ld in record.loads}
        self._log(f"sim.dispatch()  # step {index}: {parts} {loads}{zero}".rstrip(), involved)

    def execute(self) -> None:
        item = self.queue.popleft()
        self.executed += 1
        record, step = item.record, item.dispatch_index
        self._exec_of_dispatch[step] = self.executed
        self._land_due(after_zeroing=False)
        for block in record.zero_block_ids:
            self.memory.zero(block, ("zero", "", step, self.executed))
        self._land_due(after_zeroing=True)
        for src, dst in record.block_copies:
            self.memory.copy(src, dst, ("copy", "", step, self.executed))
        live = {
            e.request_id: self.sched.is_live(e.request_id, e.incarnation) for e in record.requests
        }
        for entry in record.requests:
            self._write_kv(entry, step, live[entry.request_id])
        bad_state: set[str] = set()
        for entry in record.requests:
            if self.mamba_groups:
                self._mamba(entry, step, live[entry.request_id], bad_state)
        for entry in record.requests:
            if live[entry.request_id]:
                self._read_kv(entry, step)
        sampled = {}
        for entry in record.requests:
            if entry.samples:
                sampled[entry.request_id] = [
                    self.requests[entry.request_id].tokens[entry.start + entry.num_tokens]
                ]
        ok, failed, invalid = self._reports()
        finished = self.sched.update(
            record, sampled, finished_recving=ok, failed_recving=failed, invalid_block_ids=invalid
        )
        self._owners = None
        self._log(f"sim.execute()  # step {step}", {e.request_id for e in record.requests})
        for rid, reason in finished:
            self._finished(rid, reason)
            self._log(f"sim.finish_{'eos' if reason == 'stop' else reason}({rid!r})", {rid})

    def _land_due(self, *, after_zeroing: bool) -> None:
        for _, pending in sorted(self.loads.items()):
            if (
                not pending.landed
                and pending.land_at <= self.executed
                and pending.after_zeroing == after_zeroing
            ):
                self.land_load(pending)

    def land_load(self, pending: PendingLoad) -> None:
        """The RDMA write of a load: whole attention blocks (tail slots zero, as the prefiller's were) and the state."""
        load = pending.load
        pending.landed = True
        self._landed_exec[load.request_id] = self.executed
        tags = self.tags[load.request_id]
        writer = ("load", load.request_id, pending.step, self.executed)
        bs = self.bs
        first, last = load.start // bs, _cdiv(load.end, bs)
        limit = last if pending.valid_blocks is None else first + pending.valid_blocks
        for g in self.attn_groups:
            table = load.block_ids[g]
            for j in range(first, min(limit, last)):
                block = table[j]
                self._block_loaded[block] = (pending.step, self.executed)
                for s in range(bs):
                    p = j * bs + s
                    self.memory.write_slot(block, s, tags[p] if p < load.end else ZERO, writer)
        if pending.valid_blocks is None:
            for g, mbs in self.mamba_groups:
                block = load.block_ids[g][_cdiv(load.end, mbs) - 1]
                self.memory.write_state(block, state_tag(tags, load.end), writer)
        self._log(
            f"sim.land_load({load.request_id!r})  # blocks {list(load.block_ids)}",
            {load.request_id},
        )

    # ---- loads ----------------------------------------------------------------------------
    def _start_load(self, load: LoadStart, step: int, own_exec: int) -> None:
        report_at = own_exec + self.rng.randint(0, self.workload.load_latency_steps)
        land_at = self.rng.randint(self.executed + 1, report_at)
        valid = None
        if self.rng.random() < self.workload.load_failure_rate:
            num_blocks = _cdiv(load.end, self.bs) - load.start // self.bs
            whole = self.mamba_groups or self.rng.random() < 0.5
            valid = 0 if whole else self.rng.randrange(num_blocks)
        after_zeroing = len(self.queue) == 1 and land_at == own_exec
        self.loads[load.request_id] = PendingLoad(
            load, step, land_at, report_at, valid, after_zeroing
        )
        targets: set[int] = set()
        for g in self.attn_groups:
            targets.update(load.block_ids[g][load.start // self.bs : _cdiv(load.end, self.bs)])
        for g, mbs in self.mamba_groups:
            targets.add(load.block_ids[g][_cdiv(load.end, mbs) - 1])
        self.load_blocks[load.request_id] = targets
        for block in targets:
            self.timelines[block].append(f"step {step}: load target of {load.request_id}")

    def _reports(self) -> tuple[set[str], set[str], set[int]]:
        ok: set[str] = set()
        failed: set[str] = set()
        invalid: set[int] = set()
        for rid in sorted(self.loads):
            pending = self.loads[rid]
            if pending.report_at > self.executed:
                continue
            if not pending.landed:
                self.land_load(pending)
            del self.loads[rid]
            if pending.valid_blocks is None:
                ok.add(rid)
            elif (
                self.mamba_groups or (pending.valid_blocks == 0 and self.rng.random() < 0.5)
            ) and self.sched.reports_failed_loads:
                failed.add(rid)
            else:
                # Block-level: the invalid blocks from the first one the load left unwritten.
                # Before `failed_recving` this is also how a whole failure is reported.
                load = pending.load
                first = load.start // self.bs + pending.valid_blocks
                table = load.block_ids[self.attn_groups[0]]
                invalid.update(table[first : _cdiv(load.end, self.bs)])
                ok.add(rid)
        return ok, failed, invalid

    # ---- memory effects and checks --------------------------------------------------------
    def _owner_of(self, block: int, rid: str) -> str | None:
        if self._owners is None:
            self._owners = self.sched.owners()
        others = [o for o in self._owners.get(block, ()) if o != rid]
        return others[0] if others else None

    def _hazard(
        self,
        kind_consumer: Kind,
        kind_local: Kind,
        entry: ScheduledRequest,
        block: int,
        step: int,
        same_content: Callable[[str], bool],
    ) -> None:
        owner = self._owner_of(block, entry.request_id)
        if owner is None or entry.request_id in (self._owners or {}).get(block, ()):
            return
        # A new owner that reached the block through a prefix-cache hit expects exactly what the
        # stale step writes, and reads it only in a later step: sharing by content, not a race.
        if same_content(owner):
            return
        kind = kind_consumer if block in self.load_blocks.get(owner, ()) else kind_local
        self._report(
            kind,
            step,
            (block,),
            owner,
            entry.request_id,
            f"step {step} of {entry.request_id} (no longer live) wrote block {block}, now owned by {owner}",
        )

    def _owner_index(self, owner: str, group: int, block: int) -> int | None:
        table = self.sched.block_ids(owner)[group]
        return table.index(block) if block in table else None

    def _same_kv(
        self, entry: ScheduledRequest, group: int, block: int, index: int
    ) -> Callable[[str], bool]:
        def check(owner: str) -> bool:
            j = self._owner_index(owner, group, block)
            if j is None:
                return False
            mine, theirs, bs = self.tags[entry.request_id], self.tags[owner], self.bs
            lo, hi = (
                max(entry.start, index * bs),
                min(entry.start + entry.num_tokens, (index + 1) * bs),
            )
            return all(
                j * bs + p % bs < len(theirs) and theirs[j * bs + p % bs] == mine[p]
                for p in range(lo, hi)
            )

        return check

    def _same_state(
        self, entry: ScheduledRequest, group: int, mbs: int, block: int
    ) -> Callable[[str], bool]:
        def check(owner: str) -> bool:
            i = self._owner_index(owner, group, block)
            theirs = self.tags[owner]
            if i is None or (i + 1) * mbs > len(theirs):
                return False
            return state_tag(theirs, (i + 1) * mbs) == state_tag(
                self.tags[entry.request_id], entry.start + entry.num_tokens
            )

        return check

    def _write_kv(self, entry: ScheduledRequest, step: int, live: bool) -> None:
        tags = self.tags[entry.request_id]
        writer = ("kv", entry.request_id, step, self.executed)
        bs = self.bs
        for g in self.attn_groups:
            table = entry.block_ids[g]
            hazard_checked: set[int] = set()
            for p in range(entry.start, entry.start + entry.num_tokens):
                block = table[p // bs]
                if not live and block not in hazard_checked:
                    hazard_checked.add(block)
                    self._hazard(
                        Kind.STALE_WRITE_INTO_CONSUMER_BLOCK,
                        Kind.STALE_WRITE_INTO_LOCAL_BLOCK,
                        entry,
                        block,
                        step,
                        self._same_kv(entry, g, block, p // bs),
                    )
                self.memory.write_slot(block, p % bs, tags[p], writer)
                if live:
                    self.own_blocks[entry.request_id].add(block)

    def _mamba(self, entry: ScheduledRequest, step: int, live: bool, bad: set[str]) -> None:
        rid, c, end = entry.request_id, entry.start, entry.start + entry.num_tokens
        tags = self.tags[rid]
        for g, mbs in self.mamba_groups:
            table = entry.block_ids[g]
            if c > 0 and live:
                block = table[(c - 1) // mbs]
                if block == 0:
                    self._report(
                        Kind.MAMBA_READ_NULL_BLOCK,
                        step,
                        (0,),
                        rid,
                        rid,
                        f"{rid} read its state at token {c} from the null block",
                    )
                    bad.add(rid)
                elif self.memory.states[block] != state_tag(tags, c):
                    self._state_mismatch(rid, block, c, step)
                    bad.add(rid)
            block = table[_cdiv(end, mbs) - 1]
            if not live:
                self._hazard(
                    Kind.STALE_MAMBA_WRITE_INTO_CONSUMER_BLOCK,
                    Kind.STALE_MAMBA_WRITE_INTO_LOCAL_BLOCK,
                    entry,
                    block,
                    step,
                    self._same_state(entry, g, mbs, block),
                )
            self.memory.write_state(
                block,
                POISON if rid in bad else state_tag(tags, end),
                ("state", rid, step, self.executed),
            )
            if live:
                self.own_blocks[rid].add(block)

    def _stale_self_write(self, rid: str, wstep: int) -> bool:
        """A write by the request's own step from before its last preemption: block reuse, not a connector bug."""
        return wstep < self._preempted_at.get(rid, 0)

    def _state_mismatch(self, rid: str, block: int, c: int, step: int) -> None:
        actual = self.memory.states[block]
        kind_w, writer, wstep, _ = self.memory.state_writers[block]
        if actual == POISON:
            origin = self._poison_kind.get(writer)
            if writer == rid or origin is None:
                return  # damage already reported for the request that computed this state
            kind, propagated = origin, True
        elif (
            writer == rid and kind_w in ("state", "load") and not self._stale_self_write(rid, wstep)
        ):
            kind, propagated = Kind.CORRUPTION_MAMBA_WRONG_OWN_STATE, False
        elif kind_w in ("kv", "zero"):
            kind, propagated = Kind.CORRUPTION_MAMBA_CLOBBERED_BY_STALE_KV_WRITE, False
        else:
            kind, propagated = Kind.CORRUPTION_MAMBA_STALE_WRITE, False
        self._poison_kind.setdefault(rid, kind)
        detail = f"{rid} read state at token {c} from block {block}: last written by {kind_w} of {writer or '-'} at step {wstep}"
        self._report(
            kind, step, (block,), rid, writer or kind_w, detail, propagated=propagated, since=wstep
        )

    def _read_kv(self, entry: ScheduledRequest, step: int) -> None:
        rid = entry.request_id
        tags = self.tags[rid]
        end = entry.start + entry.num_tokens
        bs = self.bs
        cache = self.verified[(rid, entry.incarnation)]
        versions = self.memory.versions
        check_tail = self.sched.needs_zeroing
        for g in self.attn_groups:
            table = entry.block_ids[g]
            last = _cdiv(end, bs) - 1
            for j in range(last + 1):
                block = table[j]
                need = bs if j < last else end - j * bs
                if cache.get(block) == (versions[block], need):
                    continue
                cache[block] = (versions[block], need)
                slots = self.memory.slots[block]
                base = j * bs
                for s in range(need):
                    if slots[s] != tags[base + s]:
                        self._kv_mismatch(rid, block, s, base + s, step)
                        break
                if check_tail and j == last:
                    for s in range(need, bs):
                        t = slots[s]
                        if t != ZERO and (base + s >= len(tags) or t != tags[base + s]):
                            self._stale_bytes(rid, block, s, step)
                            break

    def _stale_bytes(self, rid: str, block: int, slot: int, step: int) -> None:
        """Foreign bytes in the unwritten tail of a block: missing zeroing, unless written after the block was ours."""
        kind_w, writer, wstep, wexec = self.memory.slot_writers[block][slot]
        # The first moment the block held our content: its zeroing in the step that gave it to us,
        # or our load landing in it (which can come earlier, while an older step is in flight).
        ours_from = self._exec_of_dispatch.get(self._assigned_at.get((rid, block), 0), 0)
        if block in self.load_blocks.get(rid, ()) and rid in self._landed_exec:
            ours_from = min(ours_from, self._landed_exec[rid])
        if kind_w in ("kv", "state") and wexec >= ours_from:
            kind = (
                Kind.CORRUPTION_STALE_KV_WRITE
                if kind_w == "kv"
                else Kind.CORRUPTION_STALE_MAMBA_WRITE
            )
        else:
            kind = Kind.STALE_BYTES_VISIBLE
        detail = f"{rid} reads block {block} whose slot {slot} holds bytes of {kind_w} {writer or '-'} (step {wstep}), not zero"
        self._report(kind, step, (block,), rid, writer or kind_w, detail, since=wstep)

    def _kv_mismatch(self, rid: str, block: int, slot: int, pos: int, step: int) -> None:
        actual = self.memory.slots[block][slot]
        kind_w, writer, wstep, wexec = self.memory.slot_writers[block][slot]
        if actual == ZERO and kind_w == "zero":
            loaded = self._block_loaded.get(block)
            if loaded is not None and loaded[0] >= wstep and loaded[1] <= wexec:
                # zeroing landed after the load it should precede (both from the step that gave
                # the block out: an older load was a previous owner's)
                kind = Kind.CORRUPTION_ZEROED_AFTER_LOAD
            else:
                # no load wrote the block before this zeroing: the tokens were never computed
                kind = Kind.READ_UNCOMPUTED_KV
        elif actual == GARBLE and kind_w == "state" and writer != rid:
            kind = Kind.CORRUPTION_STALE_MAMBA_WRITE
        elif kind_w == "kv" and (writer != rid or self._stale_self_write(rid, wstep)):
            kind = Kind.CORRUPTION_STALE_KV_WRITE
        else:
            kind = Kind.CORRUPTION_KV_MISMATCH
        propagated = block not in self.own_blocks.get(
            rid, ()
        ) and block not in self.load_blocks.get(rid, ())
        detail = f"{rid} read token {pos} from block {block} slot {slot}: last written by {kind_w} of {writer or '-'} at step {wstep}"
        self._report(
            kind, step, (block,), rid, writer or kind_w, detail, propagated=propagated, since=wstep
        )

    def _check_zeroing_targets(self, record: StepRecord, step: int) -> None:
        # A load started by this same step is safe when no older step is in flight: the zeroing
        # then runs on an idle stream before the RDMA can land (synchronous scheduling).
        older_in_flight = len(self.queue) > 1
        outstanding = {rid for rid, p in self.loads.items() if p.step < step or older_in_flight}
        for rid in sorted(outstanding):
            hit = self.load_blocks.get(rid, set()).intersection(record.zero_block_ids)
            if hit:
                blocks = tuple(sorted(hit))
                self._report(
                    Kind.ZEROING_OF_LOAD_TARGET,
                    step,
                    blocks,
                    rid,
                    "zeroing",
                    f"step {step} zeroes blocks {list(blocks)} while {rid}'s load into them is outstanding",
                )

    # ---- bookkeeping ----------------------------------------------------------------------
    def _assign(self, rid: str, tables: tuple[tuple[int, ...], ...], step: int) -> None:
        known = self._known_blocks[rid]
        for table in tables:
            for block in table:
                if block and block not in known:
                    known.add(block)
                    self._assigned_at[(rid, block)] = step
                    self.timelines[block].append(f"step {step}: -> {rid}")

    def _released(self, rid: str, why: str) -> None:
        for block in sorted(self._known_blocks.pop(rid, ())):
            self.timelines[block].append(f"step {self.dispatched}: {rid} {why}")
        self.own_blocks.pop(rid, None)
        if why == "preempted":
            self._preempted_at[rid] = self.dispatched
            self._log(f"sim.preempt({rid!r})", {rid})

    def _finished(self, rid: str, reason: str) -> None:
        self.live_count -= 1
        self._released(rid, f"finished ({reason})")

    def _log(self, line: str, rids: set[str]) -> None:
        self.log.append((self.dispatched, line, frozenset(rids)))

    def _report(
        self,
        kind: Kind,
        step: int,
        blocks: tuple[int, ...],
        victim: str,
        culprit: str,
        detail: str,
        *,
        propagated: bool = False,
        since: int | None = None,
    ) -> None:
        key = (kind, victim, culprit, blocks)
        if key in self._seen:
            return
        self._seen.add(key)
        self.num_findings += 1
        self.kind_counts[str(kind)] += 1
        family = str(FAMILY[kind])
        self.first_step_by_family[family] = min(self.first_step_by_family.get(family, step), step)
        self.num_propagated += propagated
        if len(self.findings) >= MAX_FINDINGS_KEPT:
            return
        start = min(since if since is not None else step, step) - 2
        involved = {victim, culprit}
        lines = tuple(
            line
            for t, line, rids in self.log
            if t >= start and (rids & involved or ("dispatch" in line and t >= step - 1))
        )
        timelines = {b: tuple(self.timelines[b][-8:]) for b in blocks if b}
        reproducer = Reproducer(
            self.seed, self.workload.name, lines[-60:], timelines, self.replay_options
        )
        self.findings.append(
            Finding(kind, self.seed, step, blocks, victim, culprit, detail, propagated, reproducer)
        )
