"""The real vLLM scheduler built in-process, the way EngineCore builds it, with a simulated consumer connector.

The race harness (``pdcheck.race``) drives it step by step with a simulated executor.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import tempfile
from typing import Any

from pdcheck._vllm import sim_connector, versions
from pdcheck._vllm.capture import block_tables, capture_loads, describe_step, group_infos
from pdcheck._vllm.internals import check_internals
from pdcheck._vllm.records import LoadStart, StepRecord


@dataclasses.dataclass(frozen=True)
class SchedulerSpec:
    """The scheduler to build: cache layout, sizes, queue depth and connector policy."""

    layout: str = "attention"  # "attention" | "hybrid"
    mamba_mode: str = (
        "align"  # hybrid only: "align" (prefix caching on) | "none" (prefix caching off)
    )
    num_mamba_groups: int = 1
    mamba_first: bool = True  # the real order for Granite-4.0-H and Qwen3.5
    zeroing: bool = False  # attention layout: mixed-precision cache, so new blocks are zeroed
    num_blocks: int = 48
    block_size: int = 16
    max_num_seqs: int = 8
    max_num_batched_tokens: int = 256
    max_model_len: int = 512
    prefix_caching: bool = True
    depth: int = 2  # batches in flight: 1 synchronous, 2 async scheduling, k pipeline parallel
    load_failure_policy: str = "recompute"  # "recompute" | "fail"
    # A connector that breaks the N-1 rule on hybrids (loads all N prompt tokens): a checker self-test.
    load_all_prompt_tokens: bool = False


_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "num_hidden_layers": 2,
    "vocab_size": 2048,
    "max_position_embeddings": 4096,
    "eos_token_id": 0,
    "dtype": "float32",
}
_GRANITE_HYBRID = {
    "architectures": ["GraniteMoeHybridForCausalLM"],
    "model_type": "granitemoehybrid",
    "hidden_size": 256,
    "intermediate_size": 512,
    "shared_intermediate_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 4,
    "layer_types": ["linear_attention", "full_attention", "linear_attention", "full_attention"],
    "mamba_chunk_size": 256,
    "mamba_d_conv": 4,
    "mamba_d_head": 64,
    "mamba_d_state": 64,
    "mamba_expand": 2,
    "mamba_n_groups": 1,
    "mamba_n_heads": 8,
    "num_local_experts": 0,
    "num_experts_per_tok": 0,
    "position_embedding_type": "nope",
    "vocab_size": 2048,
    "max_position_embeddings": 4096,
    "eos_token_id": 0,
    "dtype": "float32",
}


@functools.cache
def config_only_model_dir(layout: str) -> str:
    """A directory holding only a config.json: the scheduler needs the architecture, never weights."""
    path = tempfile.mkdtemp(prefix=f"pdcheck-race-{layout}-")
    with open(f"{path}/config.json", "w") as fh:
        json.dump(_GRANITE_HYBRID if layout == "hybrid" else _LLAMA, fh)
    return path


def _vllm_config(spec: SchedulerSpec) -> Any:
    from vllm.config import (
        CacheConfig,
        KVTransferConfig,
        ModelConfig,
        ParallelConfig,
        SchedulerConfig,
        VllmConfig,
    )

    model = ModelConfig(
        model=config_only_model_dir(spec.layout),
        skip_tokenizer_init=True,
        max_model_len=spec.max_model_len,
        dtype="float32",
    )
    cache = CacheConfig(block_size=spec.block_size, enable_prefix_caching=spec.prefix_caching)
    if spec.layout == "hybrid":
        # Named, never left to the release's default: with prefix caching, vLLM before 0.28.0
        # picks "all" for a model that supports it (Granite-4.0-H does), and the harness's
        # state model is the one of the mode it names (docs/race-harness.md).
        cache.mamba_cache_mode = spec.mamba_mode
    sched = SchedulerConfig(
        max_num_seqs=spec.max_num_seqs,
        max_num_batched_tokens=spec.max_num_batched_tokens,
        max_model_len=spec.max_model_len,
        is_encoder_decoder=False,
        enable_chunked_prefill=True,
    )
    transfer = KVTransferConfig(
        kv_connector=sim_connector.SIM_CONNECTOR_CLASS,
        kv_connector_module_path=sim_connector.__name__,
        kv_role="kv_consumer",
        kv_load_failure_policy=spec.load_failure_policy,
        kv_connector_extra_config={"load_all_prompt_tokens": spec.load_all_prompt_tokens},
    )
    config = VllmConfig(
        model_config=model,
        cache_config=cache,
        scheduler_config=sched,
        kv_transfer_config=transfer,
        parallel_config=ParallelConfig(),
    )
    # The CPU platform turns async scheduling off while VllmConfig is built; a server with a
    # GPU keeps it. Setting it afterwards gives max_concurrent_batches == 2, as on a GPU.
    config.scheduler_config.async_scheduling = spec.depth > 1
    config.cache_config.num_gpu_blocks = spec.num_blocks
    if spec.depth > 2:
        config.parallel_config.pipeline_parallel_size = spec.depth
        config.scheduler_config.async_scheduling = False
    return config


def _kv_cache_config(spec: SchedulerSpec, config: Any) -> Any:
    import torch
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        MambaSpec,
    )

    attention = KVCacheGroupSpec(
        ["model.layers.1.self_attn.attn"],
        FullAttentionSpec(
            block_size=spec.block_size, num_kv_heads=2, head_size=64, dtype=torch.float32
        ),
    )
    groups = [attention]
    if spec.layout == "hybrid":
        mode = config.cache_config.mamba_cache_mode
        mamba_bs = config.cache_config.mamba_block_size
        mambas = [
            KVCacheGroupSpec(
                [f"model.layers.{2 * i}.mixer"],
                MambaSpec(
                    block_size=mamba_bs,
                    shapes=((3, 64), (8, 64, 64)),
                    dtypes=(torch.float32, torch.float32),
                    mamba_cache_mode=mode,
                ),
            )
            for i in range(spec.num_mamba_groups)
        ]
        groups = mambas + groups if spec.mamba_first else groups + mambas
    cls = KVCacheConfig
    if spec.zeroing and spec.layout == "attention":
        cls = _zeroing_kv_cache_config_cls()
    return cls(num_blocks=spec.num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)


@functools.cache
def _zeroing_kv_cache_config_cls() -> type:
    """A KVCacheConfig that asks for zeroing, as a mixed-precision cache does."""
    from vllm.v1.kv_cache_interface import KVCacheConfig

    return type(
        "ZeroingKVCacheConfig",
        (KVCacheConfig,),
        {"needs_kv_cache_zeroing": property(lambda self: True)},
    )


class SimScheduler:
    """The real vLLM scheduler (Scheduler or AsyncScheduler) and KV cache manager, driven step by step.

    Built like EngineCore builds it; the harness calls schedule() to dispatch a step and update()
    with the simulated executor's output for the oldest step in flight.
    """

    def __init__(self, spec: SchedulerSpec) -> None:
        check_internals()
        from vllm.sampling_params import SamplingParams
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_utils import (
            get_request_block_hasher,
            init_none_hash,
            resolve_kv_cache_block_sizes,
        )
        from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
        from vllm.v1.request import Request, RequestStatus
        from vllm.v1.structured_output import StructuredOutputManager

        config = _vllm_config(spec)
        kv_config = _kv_cache_config(spec, config)
        sched_bs, hash_bs = resolve_kv_cache_block_sizes(kv_config, config)
        hash_fn = get_hash_fn_by_name(config.cache_config.prefix_caching_hash_algo)
        init_none_hash(hash_fn)
        self._hasher = get_request_block_hasher(hash_bs, hash_fn)
        cls = config.scheduler_config.get_scheduler_cls()
        self._scheduler = cls(
            vllm_config=config,
            kv_cache_config=kv_config,
            structured_output_manager=StructuredOutputManager(config),
            block_size=sched_bs,
            hash_block_size=hash_bs,
        )
        self.groups = group_infos(kv_config)
        self.needs_zeroing = bool(kv_config.needs_kv_cache_zeroing)
        self._connector = self._scheduler.connector
        self._loads: list[LoadStart] = []
        capture_loads(self._connector, self._loads)
        self._SamplingParams = SamplingParams
        self._Request = Request
        self._aborted = RequestStatus.FINISHED_ABORTED
        self._ModelRunnerOutput = ModelRunnerOutput
        self._KVConnectorOutput = KVConnectorOutput

    @property
    def defer_block_free(self) -> bool:
        return bool(getattr(self._scheduler, "defer_block_free", False))

    @property
    def reports_failed_loads(self) -> bool:
        """Whether a whole failed load can be reported as such (`failed_recving`); before it only
        its invalid blocks say so, which vLLM handles for a single KV cache group only."""
        return versions.reports_failed_loads()

    @property
    def mamba_cache_mode(self) -> str:
        """The Mamba cache mode the scheduler was built with (the variant's, never the release default)."""
        return str(self._scheduler.cache_config.mamba_cache_mode)

    @property
    def scheduler_class(self) -> str:
        return type(self._scheduler).__name__

    def add_request(
        self,
        request_id: str,
        prompt: list[int],
        *,
        max_tokens: int,
        eos_token_id: int,
        remote: bool,
    ) -> None:
        params = self._SamplingParams(max_tokens=max_tokens, temperature=0.0)
        params.update_from_generation_config({}, eos_token_id=eos_token_id)
        request = self._Request(request_id, prompt, params, None, block_hasher=self._hasher)
        if remote:
            self._connector.remote.add(request_id)
        self._scheduler.add_request(request)

    def has_requests(self) -> bool:
        return bool(self._scheduler.has_requests())

    def schedule(self) -> StepRecord:
        output = self._scheduler.schedule()
        loads = list(self._loads)
        self._loads.clear()
        return describe_step(self._scheduler, output, loads)

    def update(
        self,
        step: StepRecord,
        sampled: dict[str, list[int]],
        *,
        finished_recving: set[str],
        failed_recving: set[str],
        invalid_block_ids: set[int],
    ) -> list[tuple[str, str]]:
        """Process the executor output of ``step``; returns (request id, finish reason) for finished requests."""
        req_ids = [r.request_id for r in step.requests]
        kv_output = None
        if finished_recving or failed_recving or invalid_block_ids:
            # Before `failed_recving` (0.30.0) a failed load was known only by its invalid blocks.
            failed = {"failed_recving": failed_recving} if self.reports_failed_loads else {}
            kv_output = self._KVConnectorOutput(
                finished_recving=finished_recving | failed_recving,
                invalid_block_ids=invalid_block_ids,
                **failed,
            )
        output = self._ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
            sampled_token_ids=[sampled.get(rid, []) for rid in req_ids],
            kv_connector_output=kv_output,
        )
        engine_outputs = self._scheduler.update_from_output(step.output, output)
        finished = []
        for outs in engine_outputs.values():
            for out in outs.outputs:
                if out.finish_reason is not None:
                    finished.append((out.request_id, str(out.finish_reason)))
        return finished

    def abort(self, request_id: str) -> bool:
        return bool(self._scheduler.finish_requests(request_id, self._aborted))

    def is_live(self, request_id: str, incarnation: int) -> bool:
        """True while the request is unfinished and not preempted since the step that saw ``incarnation``."""
        request = self._scheduler.requests.get(request_id)
        return (
            request is not None
            and not request.is_finished()
            and request.num_preemptions == incarnation
        )

    def num_free_blocks(self) -> int:
        return int(self._scheduler.kv_cache_manager.block_pool.get_num_free_blocks())

    def block_ids(self, request_id: str) -> tuple[tuple[int, ...], ...]:
        return block_tables(self._scheduler, request_id)

    def owners(self) -> dict[int, list[str]]:
        """Block id -> requests whose block tables hold it now (null block excluded)."""
        result: dict[int, list[str]] = {}
        for request_id in self._scheduler.requests:
            for table in block_tables(self._scheduler, request_id):
                for block in table:
                    if block:
                        result.setdefault(block, []).append(request_id)
        return result
