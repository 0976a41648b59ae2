"""Race harness: vLLM's real scheduler in-process with a simulated executor and a shadow-memory checker.

Importing this package does not import vLLM; :func:`run_race` does, inside the call.
"""

from pdcheck.race.findings import Family, Finding, Kind
from pdcheck.race.run import RaceSummary, VariantResult, run_race
from pdcheck.race.trace_check import TraceCheckResult, check_trace_dir
from pdcheck.race.workload import DEFAULT_VARIANTS, VARIANTS

__all__ = [
    "DEFAULT_VARIANTS",
    "VARIANTS",
    "Family",
    "Finding",
    "Kind",
    "RaceSummary",
    "TraceCheckResult",
    "VariantResult",
    "check_trace_dir",
    "run_race",
]
