"""Run inside a CUDA build (tests/contract/builds.py): print, as JSON, vLLM's batch-invariance support rules.

What pdcheck's bit-exact rule (`pdcheck/contracts/batch_invariance.py`) restates, each read from
the build's own code:
- which attention backends and which Mamba/GDN state backends say `supports_batch_invariance()`
  (a backend whose module cannot be imported here, for want of CUDA kernels or FlashInfer, is
  listed apart: the rule never names one, so a cell asking for it falls back, the safe side);
- whether the Mamba selector raises for a backend without it, and whether the attention
  selector rules such backends out when the mode is on;
- the lowest CUDA capability family `enable_batch_invariant_mode` handles.
"""

from __future__ import annotations

import inspect
import json
import re
import sys


def backends(enum) -> tuple[dict[str, bool], list[str]]:
    """(name -> supports, for the backends importable here), the names of the others."""
    supports: dict[str, bool] = {}
    unimportable: list[str] = []
    for member in enum:
        if not member.value:
            continue  # a tag with no class (TORCH_SDPA: ViT only)
        try:
            supports[member.name] = bool(member.get_class().supports_batch_invariance())
        except Exception:
            unimportable.append(member.name)
    return supports, unimportable


def main() -> None:
    import vllm
    from vllm.model_executor.determinism import batch_invariant
    from vllm.v1.attention import backend, selector
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, MambaAttentionBackendEnum

    attention, attention_unimportable = backends(AttentionBackendEnum)
    mamba, mamba_unimportable = backends(MambaAttentionBackendEnum)
    mamba_selector = inspect.getsource(selector._cached_get_mamba_attn_backend)
    validate = inspect.getsource(backend.AttentionBackend.validate_configuration)
    enable = inspect.getsource(batch_invariant.enable_batch_invariant_mode)
    result = {
        "vllm_version": vllm.__version__,
        "attention": attention,
        "attention_unimportable": attention_unimportable,
        "mamba": mamba,
        "mamba_unimportable": mamba_unimportable,
        "mamba_selector_raises": "supports_batch_invariance" in mamba_selector
        and "raise" in mamba_selector,
        "attention_selector_checks": "use_batch_invariant" in validate
        and "supports_batch_invariance" in validate,
        "capability_families": sorted(
            int(x) for x in re.findall(r"is_device_capability_family\(\s*(\d+)", enable)
        ),
    }
    print("PDCHECK-CONTRACT " + json.dumps(result))


if __name__ == "__main__":
    sys.exit(main())
