"""The CUDA build's CUDA platform, answering GPU queries for the simulated inventory (see pdcheck_contract_platform)."""

from __future__ import annotations

from pdcheck_contract_platform import GPU_CAPABILITY, GPU_COUNT, GPU_MEMORY_BYTES, GPU_NAME
from vllm.platforms.cuda import NonNvmlCudaPlatform
from vllm.platforms.interface import DeviceCapability


class ContractCudaPlatform(NonNvmlCudaPlatform):
    @classmethod
    def get_device_capability(cls, device_id: int = 0) -> DeviceCapability:
        return DeviceCapability(*GPU_CAPABILITY)

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return GPU_NAME

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        return GPU_MEMORY_BYTES

    @classmethod
    def is_fully_connected(cls, physical_device_ids: list[int]) -> bool:
        return True

    @classmethod
    def device_count(cls) -> int:
        return GPU_COUNT
