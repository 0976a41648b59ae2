"""The per-release facts: the supported range, and each fix's status from its form (no vLLM imported)."""

from __future__ import annotations

import pytest

from pdcheck._vllm import versions
from pdcheck.contracts.fixes import FixStatus, describe_statuses, statuses_from_record


@pytest.mark.parametrize(
    ("version", "older"),
    [
        ("0.19.1", True),
        ("0.19.9.dev3+gabc", True),
        ("0.20.0", False),
        ("0.20.0rc1", False),  # a release candidate of the oldest release has its code
        ("0.32.1.dev12+g5df63a7.cpu", False),
        ("unknown", False),  # a tree without metadata is judged by its names, not refused
    ],
)
def test_only_a_release_before_the_oldest_supported_is_refused_by_version(version, older):
    assert versions.is_older_than_supported(version) is older


def _with_form(monkeypatch, forms: dict[str, str | None]) -> None:
    by_name = {(f.fix, f.form): f for f in versions.FIX_FORMS}
    monkeypatch.setattr(
        versions, "fix_form", lambda fix: by_name[(fix, forms[fix])] if forms[fix] else None
    )


@pytest.mark.parametrize(
    ("version", "forms", "expected"),
    [
        ("0.23.0", {"block-reuse": None, "zeroing": None}, "block-reuse absent, zeroing absent"),
        (
            "0.25.0",
            {"block-reuse": "deferred-free", "zeroing": None},
            "block-reuse present (deferred-free), zeroing absent",
        ),
        (
            "0.31.0",
            {"block-reuse": "deferred-free", "zeroing": "skip-zero-block-ids"},
            "block-reuse present (deferred-free), zeroing present (skip-zero-block-ids)",
        ),
        # A release after the fix landed whose names match no known form: a rework pdcheck does
        # not know yet is unknown, never "absent" (its switch would be a silent no-op).
        (
            "0.40.0",
            {"block-reuse": "deferred-free", "zeroing": None},
            "block-reuse present (deferred-free), zeroing unknown",
        ),
    ],
)
def test_each_fix_is_named_by_its_form_or_absent_or_unknown(monkeypatch, version, forms, expected):
    _with_form(monkeypatch, forms)
    statuses = {fix: versions.fix_status(fix, version).to_dict() for fix in forms}
    assert describe_statuses(statuses) == expected


def test_every_fix_has_a_form_and_the_first_releases_are_the_wheels():
    assert versions.first_release("block-reuse") == "0.24.0"
    assert versions.first_release("zeroing") == "0.26.0"


def test_older_records_bool_fixes_still_read():
    """Run folders written before fix forms hold `{fix: bool or null}`."""
    assert statuses_from_record({"block-reuse": True, "zeroing": None}) == {
        "block-reuse": FixStatus("block-reuse", "present"),
        "zeroing": FixStatus("zeroing", "unknown"),
    }
    assert describe_statuses({"block-reuse": False}) == "block-reuse absent"
    assert describe_statuses(None) == "unknown"
