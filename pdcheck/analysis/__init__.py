"""Analysis: paired statistics against a same-run baseline, agreement, verdicts, attribution.

Pure functions on `QuestionRecord`s and numpy arrays; no I/O, no vLLM. See docs/analysis.md.
"""

from pdcheck.analysis.attribution import ArmObservation, Attribution, attribute
from pdcheck.analysis.injection import (
    InjectionPrecision,
    divergence_precision,
    injection_precision,
)
from pdcheck.analysis.paired import PairedComparison, compare_paired
from pdcheck.analysis.sequential import EarlyStop, SequentialTest
from pdcheck.analysis.verdict import (
    CanaryStatus,
    CellVerdict,
    Outcome,
    Status,
    Verdict,
    canary_status,
    decide,
    judge,
)

__all__ = [
    "ArmObservation",
    "Attribution",
    "CanaryStatus",
    "CellVerdict",
    "EarlyStop",
    "InjectionPrecision",
    "Outcome",
    "PairedComparison",
    "SequentialTest",
    "Status",
    "Verdict",
    "attribute",
    "canary_status",
    "compare_paired",
    "decide",
    "divergence_precision",
    "injection_precision",
    "judge",
]
