"""`python -m pdcheck._vllm.fixes`: which race fixes this python's vLLM has, as JSON on one line.

The answer is `versions.fix_statuses()`: the fix switches' own resolution of each fix's forms
(`versions.FIX_FORMS`), so `pdcheck doctor`, the run record and the plugin cannot disagree on
whether a fix is present or in which form. A vLLM that cannot be imported at all answers
`unknown` for every fix, with the error.
"""

from __future__ import annotations

import json
import traceback

from pdcheck._vllm.versions import fix_statuses
from pdcheck.contracts.fixes import unknown_statuses
from pdcheck.contracts.vllm_programs import FIXES_PREFIX


def main() -> None:
    error: str | None = None
    try:
        import vllm  # noqa: F401
    except Exception:
        statuses, error = unknown_statuses(), traceback.format_exc(limit=-2)
    else:
        statuses = fix_statuses()
    answer = {"fixes": {fix: s.to_dict() for fix, s in statuses.items()}, "error": error}
    print(FIXES_PREFIX + json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
