"""Fix switches: turn vLLM's block-reuse fix or zeroing fix off at run time, in a server or in the harness.

Why: vLLM has no switch for either fix (PR #45357, PR #48481), and a suite that never sees the race
it hunts proves nothing. ``PDCHECK_DISABLE_FIXES`` (read by the plugin in every vLLM process) and
``pdcheck race --disable-fix`` both go through :func:`disable_fixes`, so there is one implementation.

- ``block-reuse``: new Scheduler instances free a request's blocks at once even while a step that
  writes them is in flight (``defer_block_free`` forced False).
- ``zeroing``: blocks a connector will load stay on the zero list, in either form of the fix
  (``pdcheck._vllm.versions.FIX_FORMS``).

When the installed vLLM predates a fix, its switch is a no-op and :func:`status` says so: the fix arm
then equals the no-fix arm for this vLLM (the report's Environment section says so for such an
arm). Importing this module does not import vLLM.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Iterator, Mapping

from pdcheck.contracts import environment
from pdcheck.contracts.fixes import FIXES
from pdcheck.errors import ConfigError, VllmIncompatible

logger = logging.getLogger(__name__)

ENV_VAR = environment.DISABLE_FIXES.name

_installed = contextlib.ExitStack()
_installed_names: list[str] = []
_absent: set[str] = set()


def parse_fixes(value: str | Iterable[str]) -> tuple[str, ...]:
    """``"block-reuse,zeroing"`` or a list of names -> validated, de-duplicated names in FIXES order."""
    names = [n.strip() for n in (value.split(",") if isinstance(value, str) else value)]
    names = [n for n in names if n]
    unknown = sorted(set(names) - set(FIXES))
    if unknown:
        raise ConfigError(
            f"unknown fix {', '.join(unknown)!s}; allowed: {', '.join(FIXES)} (comma-separated)"
        )
    return tuple(f for f in FIXES if f in names)


def _patch_for(name: str) -> contextlib.AbstractContextManager[None]:
    from pdcheck._vllm import patches

    return (
        patches.patch_block_reuse_fix_off()
        if name == "block-reuse"
        else patches.patch_zeroing_fix_off()
    )


def _present(name: str) -> bool:
    """Whether the switch has a fix to turn off; a fix in a form pdcheck does not know is refused."""
    from pdcheck._vllm import internals, versions

    status = versions.fix_statuses()[name]
    if status.state == "unknown":
        raise VllmIncompatible(
            internals.vllm_version(),
            [],
            reason=f"its {name} fix has a form pdcheck does not know (known: "
            + ", ".join(f.form for f in versions.FIX_FORMS if f.fix == name)
            + "), so it cannot be switched off",
        )
    if status.state == "absent" and name not in _absent:
        _absent.add(name)
        logger.warning(
            "vLLM %s has no %s fix; disabling it is a no-op (the fix arm equals the no-fix arm)",
            internals.vllm_version(),
            name,
        )
    return status.state == "present"


@contextlib.contextmanager
def disable_fixes(names: str | Iterable[str]) -> Iterator[list[str]]:
    """Turn the named fixes off for schedulers built inside the block; yields the switches actually applied."""
    applied: list[str] = []
    with contextlib.ExitStack() as stack:
        for name in parse_fixes(names):
            if name in _installed_names or not _present(name):
                continue
            stack.enter_context(_patch_for(name))
            applied.append(name)
        yield applied


def install_from_env(environ: Mapping[str, str]) -> list[str]:
    """Apply ``PDCHECK_DISABLE_FIXES`` for the life of the process; idempotent; returns the switches applied."""
    names = parse_fixes(environ.get(ENV_VAR, ""))
    for name in names:
        if name in _installed_names or not _present(name):
            continue
        _installed.enter_context(_patch_for(name))
        _installed_names.append(name)
        logger.info("pdcheck: %s fix disabled in this process", name)
    return list(_installed_names)


def status() -> dict[str, list[str]]:
    """For activation markers and run environments: switches applied in this process and fixes this vLLM lacks."""
    from pdcheck._vllm import internals

    present = internals.fixes_present()
    return {
        "disabled": list(_installed_names),
        "fixes_present": [f for f in FIXES if present[f]],
        "fixes_absent": [f for f in FIXES if not present[f]],
    }
