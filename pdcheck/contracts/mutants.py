"""The names of pdcheck's test-only mutants of vLLM's PD code (`PDCHECK_MUTANT`, an arm's `mutant:`).

Spelled here so the sweep schema can check an arm before anything starts and the plugin can
check the variable in a server, with one list; `pdcheck._vllm.serving_mutants` says what each
breaks and applies it.
"""

MUTANTS: tuple[str, ...] = (
    "early-free",
    "short-block-count",
    "boundary-short-read",
    "hybrid-guard-inverted",
    "load-finished-early",
    "prefix-hit-wrong-end",
    "advertised-order-swapped",
)
