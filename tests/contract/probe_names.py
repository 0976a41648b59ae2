"""Run inside a CUDA build (tests/contract/builds.py): print, as JSON, the vLLM names pdcheck depends on that it lacks.

- the race harness's and fix switches' internals (`REQUIRED_NAMES`, each fix's form), and the
  plugin's worker-side names (`check_worker_names`), all from pdcheck/_vllm;
- the Prometheus sample names a NIXL decoder exposes, from vLLM's own stat logger with a NIXL
  KV-transfer config, so that serving/metrics.py reads counters that exist.

Run with the CPU platform (VLLM_TARGET_DEVICE=cpu): none of these names depends on the
platform, and on the CUDA platform importing NIXL's connector reaches the quantization utils,
which ask the CUTLASS kernels (the build's `_C`, which needs libcuda) what they support at
import time.
"""

from __future__ import annotations

import json

from pdcheck._vllm.internals import REQUIRED_NAMES, missing_names
from pdcheck._vllm.sim_scheduler import config_only_model_dir
from pdcheck._vllm.versions import fix_statuses
from pdcheck._vllm.worker import check_worker_names
from pdcheck.errors import VllmIncompatible


def worker_names_missing() -> list[str]:
    try:
        check_worker_names()
    except VllmIncompatible as exc:
        return list(exc.missing)
    return []


def metric_names() -> list[str]:
    from prometheus_client import REGISTRY, generate_latest
    from vllm.config import KVTransferConfig, ModelConfig, VllmConfig
    from vllm.v1.metrics.loggers import PrometheusStatLogger

    from pdcheck.serving.metrics import parse_prometheus

    model = ModelConfig(
        model=config_only_model_dir("attention"), skip_tokenizer_init=True, max_model_len=512
    )
    transfer = KVTransferConfig(kv_connector="NixlConnector", kv_role="kv_consumer")
    PrometheusStatLogger(
        VllmConfig(model_config=model, kv_transfer_config=transfer), engine_indexes=[0]
    )
    samples = parse_prometheus(generate_latest(REGISTRY).decode())
    return sorted(
        {
            f"{name}{{source={labels['source']}}}" if "source" in labels else name
            for name, labels, _ in samples
            if name.startswith("vllm:")
        }
    )


def main() -> None:
    import vllm

    result = {
        "vllm_version": vllm.__version__,
        "required_missing": missing_names(REQUIRED_NAMES),
        "fixes": {fix: status.to_dict() for fix, status in fix_statuses().items()},
        "worker_names_missing": worker_names_missing(),
        "metrics": metric_names(),
    }
    print("PDCHECK-CONTRACT " + json.dumps(result))


if __name__ == "__main__":
    main()
