"""Injection precision: injected X-Request-Ids map to questions by -q(\\d+)$, scored against the flags."""

from __future__ import annotations

import pytest

from pdcheck.analysis import injection_precision
from pdcheck.analysis.injection import injected_indices
from tests.unit.analysis.builders import injection


def test_request_ids_map_to_question_indices():
    """`pd-c8-r0-q00042` is question 42; other runs' ids are left out when a run tag is given."""
    log = [injection("pd-c8-r0-q00042"), "pd-c8-r0-q00007", injection("pd-c1-r0-q00001")]
    assert injected_indices(log) == {42, 7, 1}
    assert injected_indices(log, run_tag="pd-c8-r0") == {42, 7}


def test_malformed_ids_are_an_error_naming_the_expected_shape():
    """An id without the -q<index> suffix cannot be mapped and says what shape is expected."""
    with pytest.raises(ValueError, match="-q<index>"):
        injected_indices(["cmpl-abc"])


def test_precision_and_recall():
    """Precision = hits/flagged, recall = hits/injected, with the misses and false positives listed."""
    log = [f"run-q{i:05d}" for i in (1, 2, 3, 4)]
    p = injection_precision(log, [2, 3, 9], questions=range(10))
    assert (p.n_true_positive, p.n_flagged, p.n_injected) == (2, 3, 4)
    assert p.precision == pytest.approx(2 / 3) and p.recall == pytest.approx(0.5)
    assert p.false_positives == (9,) and p.missed == (1, 4)


def test_scope_excludes_questions_not_compared():
    """An injected request whose record failed is out of scope, not a miss."""
    p = injection_precision(["run-q00001", "run-q00002"], [1], questions=[1, 3])
    assert p.recall == 1.0 and p.n_injected == 1
    assert injection_precision([], []).precision is None
