"""Name why a harness run on other vLLM source could not run, in one line: an import error first.

The adapter reports a name it cannot resolve as `VllmIncompatible ... missing: module:Name`,
whether the module lacks the name or the module does not import at all. On mixed source (a
commit's or a release's Python over another build's compiled parts) the second is the usual
cause, so the modules named there are imported again in the same environment and the real
`ImportError` is what gets reported.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable, Mapping

# Imports each module named in argv; prints {module: "Type: message"} for those that fail.
_PROBE = r"""
import importlib, json, sys
failed = {}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except BaseException as exc:
        msg = str(exc).strip().splitlines()
        failed[name] = type(exc).__name__ + (": " + msg[-1] if msg else "")
print(json.dumps(failed))
"""
_MODULE = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_]\w*)*$")
_ERROR_LINE = re.compile(r"^([A-Z]\w*(Error|Exception|Incompatible|Exit)\b[^:]*):\s*(.*)$")
_IMPORT_ERROR_IN = re.compile(r"\b(ImportError|ModuleNotFoundError|SyntaxError|IndentationError):")

Prober = Callable[[list[str]], Mapping[str, str]]


def missing_modules(text: str) -> list[str]:
    """The modules of the names a `VllmIncompatible ... missing: a.b:C.d, ...` line lists."""
    match = re.search(r"missing: (.*?)(\. Update|$)", text, re.M)
    if match is None:
        return []
    modules: list[str] = []
    for item in match.group(1).split(", "):
        module = re.split(r"[:\s(]", item.strip(), maxsplit=1)[0]
        if _MODULE.match(module) and module not in modules:
            modules.append(module)
    return modules


def last_error_line(text: str) -> str | None:
    """The last `SomeError: message` line of a run's output (a traceback's, or pdcheck's own)."""
    for line in reversed(text.strip().splitlines()):
        if _ERROR_LINE.match(line.strip()):
            return line.strip()
    return None


def explain_failure(text: str, probe: Prober) -> str:
    """One line saying why the run could not judge its vLLM, naming an import error as one."""
    line = last_error_line(text)
    # The import error may be the line's own type or wrapped ("HarnessError: ... SyntaxError: ...").
    if line is not None and (found := _IMPORT_ERROR_IN.search(line)):
        return f"does not import: {line[found.start() :]}"
    modules = missing_modules(text)
    failed = dict(probe(modules)) if modules else {}
    if failed:
        module, error = next(iter(failed.items()))
        more = f" (and {len(failed) - 1} more module(s))" if len(failed) > 1 else ""
        return f"does not import: {module}: {error}{more}"
    if line is not None:
        return line
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "(no output)"


def is_import_failure(reason: str) -> bool:
    return reason.startswith("does not import")


def subprocess_prober(python: str, env: Mapping[str, str], *, cwd: str | None = None) -> Prober:
    """A prober that imports modules in a child `python` with `env` (the overlay on PYTHONPATH)."""

    def probe(modules: list[str]) -> Mapping[str, str]:
        proc = subprocess.run(
            [python, "-c", _PROBE, *modules],
            capture_output=True,
            text=True,
            env=dict(env),
            cwd=cwd,
            timeout=600,
        )
        try:
            return dict(json.loads(proc.stdout.strip().splitlines()[-1]))
        except (ValueError, IndexError):
            return {}

    return probe
