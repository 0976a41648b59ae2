"""`pdcheck trace check`: the harness's ownership rules applied to a scheduler trace recorded by the plugin.

A trace has no GPU timing, so this reports hazard *windows*, never corruption:
- block reuse: a dispatched step gives a block to request X (its table or its load) while an older
  step that writes that block for another request R has not been processed yet;
- zeroing: a step zeroes a block that an outstanding connector load (started, not yet reported)
  writes.
Both are impossible with vLLM's fixes in place; each is the window in which the race can corrupt KV.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

from pdcheck.race.findings import Finding, Kind, Reproducer
from pdcheck.vllm_plugin.trace_format import TraceFile, read_trace_dir

MAX_KEPT = 50


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclasses.dataclass(frozen=True)
class TraceCheckResult:
    """Hazards found in one trace directory, with what was read."""

    directory: str
    files: int
    segments: int  # scheduler lifetimes (one "start" event each)
    steps: int
    num_findings: int
    findings: tuple[Finding, ...]

    @property
    def clean(self) -> bool:
        return self.num_findings == 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "directory": self.directory,
            "files": self.files,
            "segments": self.segments,
            "steps": self.steps,
            "num_findings": self.num_findings,
            "findings": [f.to_dict() for f in self.findings],
        }


class _Segment:
    """One scheduler's lifetime in a trace: replays steps and applies the ownership rules."""

    def __init__(
        self, start: dict[str, Any], source: str, findings: list[Finding], counter: list[int]
    ) -> None:
        self.groups = [(kind, bs) for kind, bs in start["groups"]]
        self.source = source
        self.findings = findings
        self.counter = counter
        self.in_flight: collections.OrderedDict[int, dict[str, set[int]]] = (
            collections.OrderedDict()
        )
        self.known: dict[str, set[int]] = collections.defaultdict(set)
        self.tables: dict[str, list[list[int]]] = {}  # the worker's view: block ids per group
        self.outstanding_loads: dict[str, set[int]] = {}
        self.load_targets: dict[str, set[int]] = {}
        self.seen: set[tuple] = set()
        self.steps = 0
        self.lines: collections.deque[str] = collections.deque(maxlen=12)

    def written_blocks(self, start: int, num: int, tables: list[list[int]]) -> set[int]:
        blocks: set[int] = set()
        for (kind, bs), table in zip(self.groups, tables, strict=False):
            if kind == "attention":
                blocks.update(table[start // bs : _cdiv(start + num, bs)])
            elif table:
                index = _cdiv(start + num, bs) - 1
                if index < len(table):
                    blocks.add(table[index])
        blocks.discard(0)
        return blocks

    def fresh_blocks(self, start: int, tables: list[list[int]]) -> set[int]:
        """Blocks past the request's computed prefix. Those inside it are prefix-cache hits (shared by
        content, so a stale writer writes what the new owner expects) or its own loaded blocks (checked
        when the load started)."""
        blocks: set[int] = set()
        for (kind, bs), table in zip(self.groups, tables, strict=False):
            first = (
                start // bs if kind == "attention" else ((start - 1) // bs + 1 if start > 0 else 0)
            )
            blocks.update(table[first:])
        blocks.discard(0)
        return blocks

    def load_blocks(self, tables: list[list[int]], start: int, end: int) -> set[int]:
        blocks: set[int] = set()
        for (kind, bs), table in zip(self.groups, tables, strict=False):
            if kind == "attention":
                blocks.update(table[start // bs : _cdiv(end, bs)])
            elif table:
                blocks.add(table[_cdiv(end, bs) - 1])
        blocks.discard(0)
        return blocks

    def step(self, event: dict[str, Any]) -> None:
        self.steps += 1
        index = event["i"]
        self.lines.append(
            f"step {index}: " + " ".join(f"{r[0]}[{r[1]}:{r[1] + r[2]}]" for r in event["reqs"])
        )
        for rid in event.get("preempted", []) + event.get("finished", []):
            self.known.pop(rid, None)
        new_loads: set[str] = set()
        for rid, tables, start, end in event.get("loads", []):
            targets = self.load_blocks(tables, start, end)
            self.outstanding_loads[rid] = targets
            new_loads.add(rid)
            self.load_targets[rid] = targets
            self._check_reuse(index, rid, targets, consumer=True)
        written: dict[str, set[int]] = {}
        for rid, start, num, delta, mode in event["reqs"]:
            if mode != "cached" or rid not in self.tables:
                self.tables[rid] = [list(g) for g in delta or ()]
            elif delta is not None:
                for table, added in zip(self.tables[rid], delta, strict=False):
                    table.extend(added)
            tables = self.tables[rid]
            new = {b for table in tables for b in table if b} - self.known[rid]
            self._check_reuse(
                index,
                rid,
                new & self.fresh_blocks(start, tables),
                consumer=rid in self.load_targets,
            )
            self.known[rid] |= new
            if num > 0:
                written[rid] = self.written_blocks(start, num, tables)
        zero = set(event.get("zero", []))
        if zero:
            # A load this step starts is safe when no older step is in flight (synchronous
            # scheduling): the zeroing runs on an idle stream before the RDMA can land.
            for rid, targets in sorted(self.outstanding_loads.items()):
                if rid in new_loads and not self.in_flight:
                    continue
                hit = targets & zero
                if hit:
                    self._report(
                        Kind.ZEROING_OF_LOAD_TARGET,
                        index,
                        hit,
                        rid,
                        "zeroing",
                        f"step {index} zeroes blocks {sorted(hit)} while {rid}'s load into them is outstanding",
                    )
        self.in_flight[index] = written

    def free(self, event: dict[str, Any]) -> None:
        self.known.pop(event["rid"], None)
        self.tables.pop(event["rid"], None)

    def _check_reuse(self, index: int, rid: str, blocks: set[int], *, consumer: bool) -> None:
        if not blocks:
            return
        for old_index, writes in self.in_flight.items():
            for writer, written in writes.items():
                # A writer that still holds the block shares it legitimately (a prefix-cache hit).
                hit = (written & blocks) - self.known.get(writer, set())
                if writer != rid and hit:
                    kind = (
                        Kind.STALE_WRITE_INTO_CONSUMER_BLOCK
                        if consumer
                        else Kind.STALE_WRITE_INTO_LOCAL_BLOCK
                    )
                    self._report(
                        kind,
                        index,
                        hit,
                        rid,
                        writer,
                        f"step {index} gives blocks {sorted(hit)} to {rid} while step {old_index}, which writes them for {writer}, is in flight",
                    )

    def done(self, event: dict[str, Any]) -> None:
        if self.in_flight:
            self.in_flight.popitem(last=False)
        for rid in event.get("ok", []) + event.get("failed", []):
            self.outstanding_loads.pop(rid, None)

    def _report(
        self, kind: Kind, step: int, blocks: set[int], victim: str, culprit: str, detail: str
    ) -> None:
        key = (kind, victim, culprit)
        if key in self.seen:
            return
        self.seen.add(key)
        self.counter[0] += 1
        if len(self.findings) < MAX_KEPT:
            rep = Reproducer(-1, self.source, tuple(self.lines), {})
            self.findings.append(
                Finding(kind, -1, step, tuple(sorted(blocks)), victim, culprit, detail, False, rep)
            )


def check_trace_files(files: list[TraceFile], directory: str = "") -> TraceCheckResult:
    findings: list[Finding] = []
    counter = [0]
    segments = steps = 0
    for trace in files:
        segment: _Segment | None = None
        for event in trace.events:
            kind = event["e"]
            if kind == "start":
                if segment is not None:
                    steps += segment.steps
                segment = _Segment(event, trace.path, findings, counter)
                segments += 1
            elif segment is None:
                continue  # events before the first start belong to a scheduler we did not see start
            elif kind == "step":
                segment.step(event)
            elif kind == "done":
                segment.done(event)
            elif kind == "free":
                segment.free(event)
        if segment is not None:
            steps += segment.steps
    return TraceCheckResult(directory, len(files), segments, steps, counter[0], tuple(findings))


def check_trace_dir(directory: str) -> TraceCheckResult:
    """Read every trace file under ``directory`` and apply the ownership rules."""
    return check_trace_files(read_trace_dir(directory), directory)
