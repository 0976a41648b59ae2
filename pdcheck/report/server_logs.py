"""The server-logs section: which of the run's server logs hold a traceback, and which error.

A clean stop leaves no traceback in a vLLM server's log (`results.server_logs`), so one that
is there is named, with the line to open, beside the verdicts: a crash, a failed request, or a
shutdown that went wrong.
"""

from __future__ import annotations

from pdcheck.results.load import RunResults
from pdcheck.results.server_logs import cell_server_logs

__all__ = ["server_logs_section"]

# Enough to point a reviewer at the logs; the rest are counted.
_LISTED = 10


def server_logs_section(run: RunResults) -> str | None:
    """The section's markdown, or None when the run kept no server logs (attach mode)."""
    read = 0
    found = []
    for cell in run.cells:
        logs = cell_server_logs(run.log_files(cell))
        if logs is None:
            continue
        read += len(logs.logs)
        found += [(cell.name, tb) for tb in logs.tracebacks]
    if not read:
        return None
    if not found:
        return f"No traceback in the {read} server logs of the run."
    lines = [
        f"{len(found)} traceback{'s' if len(found) != 1 else ''} in the {read} server logs of the "
        "run (a clean stop leaves none):",
        "",
        *(f"- `{cell}` {tb.describe()}" for cell, tb in found[:_LISTED]),
    ]
    if len(found) > _LISTED:
        lines.append(f"- … and {len(found) - _LISTED} more")
    return "\n".join(lines)
