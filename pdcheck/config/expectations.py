"""Where a canary arm can be flagged: per concurrency level, an expected flag or a control.

An injection arm writes the races' effects into the KV itself, so it is expected to be flagged
at every level. A race arm (fixes switched off) only removes a guard, and the race behind the
guard needs two things vLLM gives it only sometimes (shared notes gpu-vs-cpu.md, from the CUDA
sources of vLLM 0.32 and 0.33):
- async scheduling: `defer_block_free` turns on only with async scheduling and a KV consumer
  (v1/core/sched/scheduler.py), and with async off `max_concurrent_batches` is 1, so no step
  is ever in flight when a freed block is reused or a loaded block is zeroed;
- concurrency of at least 2: at concurrency 1 nothing is in flight when the next request
  arrives.
Where either is missing, fixes-off runs exactly the code fixes-on runs: the level is a
control, and it must PASS like any clean arm.

The zeroing race needs a third: vLLM zeroes newly allocated blocks only when
`KVCacheConfig.needs_kv_cache_zeroing`, which Mamba layers (a hybrid model) or attention groups
of different precisions turn on (v1/kv_cache_interface.py; shared notes races.md). On a
full-attention model no block is zeroed, so a zeroing-off arm whose only switch is zeroing is a
control at every level.
"""

from __future__ import annotations

from dataclasses import dataclass

from pdcheck.config.cells import Cell

__all__ = ["LevelExpectation", "level_expectation"]

# The fewest requests in flight at which a race arm can fire.
RACE_MIN_CONCURRENCY = 2
# The fix whose race needs vLLM to zero new blocks (only for hybrid models' caches).
ZEROING_FIX = "zeroing"


@dataclass(frozen=True)
class LevelExpectation:
    """Whether a cell at one concurrency level is expected to be flagged, and why."""

    flag: bool
    why: str

    @property
    def label(self) -> str:
        return "expected to flag" if self.flag else "must PASS"


def level_expectation(cell: Cell, concurrency: int) -> LevelExpectation:
    arm = cell.arm
    if not arm.canary:
        return LevelExpectation(False, "clean arm")
    if arm.inject is not None:
        return LevelExpectation(True, "injected KV faults corrupt answers at every level")
    if not arm.disable_fixes:
        return LevelExpectation(True, "canary arm")
    fixes = ", ".join(arm.disable_fixes)
    if set(arm.disable_fixes) <= {ZEROING_FIX} and cell.model.kind != "hybrid":
        return LevelExpectation(
            False,
            f"control: vLLM zeroes no new block for a {cell.model.kind} model (no Mamba layers), "
            "so the zeroing race cannot fire",
        )
    if not cell.async_scheduling:
        return LevelExpectation(
            False,
            f"control: with async scheduling off no step is in flight and "
            f"defer_block_free is off, so {fixes} off runs the fixes-on code",
        )
    if concurrency < RACE_MIN_CONCURRENCY:
        return LevelExpectation(
            False,
            f"control: at concurrency {concurrency} no step is in flight when "
            f"the next request arrives, so the {fixes} race cannot fire",
        )
    return LevelExpectation(
        True,
        f"async scheduling on and {RACE_MIN_CONCURRENCY}+ requests in flight: "
        f"the {fixes} race can fire",
    )
