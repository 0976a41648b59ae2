"""The simulated consumer connector the race harness's scheduler is built with.

A module of its own because vLLM's connector factory imports ``kv_connector_module_path`` and
reads the class from it by name.
"""

from __future__ import annotations

import functools
from typing import Any

from pdcheck._vllm.capture import group_infos

SIM_CONNECTOR_CLASS = "PdcheckSimConsumerConnector"


@functools.cache
def _sim_connector_cls() -> type:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (
        KVConnectorBase_V1,
        KVConnectorMetadata,
        SupportsHMA,
    )

    class PdcheckSimConsumerConnector(KVConnectorBase_V1, SupportsHMA):
        """A PD consumer: remote requests load their prompt (N-1 tokens for hybrids) asynchronously."""

        def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
            super().__init__(vllm_config, role, kv_cache_config)
            self.remote: set[str] = set()
            # The N-1 rule (NIXL's _prefill_backoff): a hybrid decoder loads h(N-1) and computes token N-1.
            hybrid = any(i.kind == "mamba" for i in group_infos(kv_cache_config))
            load_all = vllm_config.kv_transfer_config.kv_connector_extra_config.get(
                "load_all_prompt_tokens", False
            )
            self.backoff = 1 if hybrid and not load_all else 0

        def get_num_new_matched_tokens(
            self, request: Any, num_computed_tokens: int
        ) -> tuple[int, bool]:
            if request.request_id not in self.remote:
                return 0, False
            num = request.num_prompt_tokens - self.backoff - num_computed_tokens
            return (num, True) if num > 0 else (0, False)

        def update_state_after_alloc(
            self, request: Any, blocks: Any, num_external_tokens: int
        ) -> None:
            if num_external_tokens > 0:
                self.remote.discard(
                    request.request_id
                )  # one load per request, as a prefiller sends once

        def get_loaded_kv_cache_group_ids(self, request: Any) -> tuple[int, ...]:
            return self._kv_cache_config.transfer_group_ids

        def build_connector_meta(self, scheduler_output: Any) -> Any:
            return KVConnectorMetadata()

        def request_finished(self, request: Any, block_ids: Any) -> tuple[bool, None]:
            return False, None

        def request_finished_all_groups(self, request: Any, block_ids: Any) -> tuple[bool, None]:
            return False, None

        # Worker-side methods: the simulated executor never calls them.
        def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None: ...
        def wait_for_layer_load(self, layer_name: str) -> None: ...
        def save_kv_layer(
            self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any
        ) -> None: ...
        def wait_for_save(self) -> None: ...

    return PdcheckSimConsumerConnector


def __getattr__(name: str) -> Any:
    # vLLM's connector factory does getattr(module, kv_connector); building the class lazily keeps
    # this module importable without vLLM.
    if name == SIM_CONNECTOR_CLASS:
        return _sim_connector_cls()
    raise AttributeError(name)
