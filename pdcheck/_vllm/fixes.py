"""`python -m pdcheck._vllm.fixes`: which race fixes this python's vLLM has, as JSON on one line.

The answer is `internals.fixes_present()`: the fix switches' own attribute resolution of
`FIX_NAMES`, so `pdcheck doctor`, the run record and the plugin cannot disagree on whether a
fix is present. A vLLM that cannot be imported at all answers `null` for every fix (unknown),
with the error.
"""

from __future__ import annotations

import json
import traceback

from pdcheck._vllm.internals import FIX_NAMES, fixes_present
from pdcheck.contracts.vllm_programs import FIXES_PREFIX


def main() -> None:
    try:
        import vllm  # noqa: F401
    except Exception:
        answer: dict = {
            "fixes": dict.fromkeys(FIX_NAMES),
            "error": traceback.format_exc(limit=-2),
        }
    else:
        answer = {"fixes": fixes_present(), "error": None}
    print(FIXES_PREFIX + json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
