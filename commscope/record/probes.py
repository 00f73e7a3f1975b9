"""Periodic resource samples: process CPU and RSS (psutil) and the rank's own GPU (NVML).

A missing NVML library, driver or GPU is normal: samples then carry CPU fields, and the
reason NVML is unavailable is reported once in ``gpu_error``.
"""

from __future__ import annotations

import os
from typing import Any

import psutil


def _visible_index(cuda_index: int) -> int:
    """Map a CUDA device index to the NVML index, honouring CUDA_VISIBLE_DEVICES."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if not visible:
        return cuda_index
    ids = [v.strip() for v in visible.split(",") if v.strip()]
    if cuda_index < len(ids) and ids[cuda_index].isdigit():
        return int(ids[cuda_index])
    return cuda_index  # UUID lists: fall back to the logical index


class NvmlProbe:
    """Samples one GPU through pynvml; every failure becomes ``error`` and no numbers."""

    def __init__(self, cuda_index: int | None):
        self.handle: Any = None
        self.error: str | None = None
        self._nvml: Any = None
        if cuda_index is None:
            self.error = "no CUDA device in use"
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(_visible_index(cuda_index))
        except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, driver errors
            self.error = f"NVML unavailable: {exc or type(exc).__name__}"
            self.handle = None

    def sample(self) -> dict[str, Any]:
        if self.handle is None:
            return {}
        nv = self._nvml
        out: dict[str, Any] = {}
        for key, fn in (
            ("gpu_util", lambda h: nv.nvmlDeviceGetUtilizationRates(h).gpu),
            ("gpu_mem", lambda h: nv.nvmlDeviceGetMemoryInfo(h).used),
            ("gpu_mem_total", lambda h: nv.nvmlDeviceGetMemoryInfo(h).total),
            ("gpu_power", lambda h: nv.nvmlDeviceGetPowerUsage(h) / 1000.0),
            ("gpu_temp", lambda h: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
        ):
            try:
                out[key] = fn(self.handle)
            except Exception:
                pass  # some fields are unsupported on some boards
        return out

    def close(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass
            self._nvml = None


class ResourceProbe:
    """One sample: CPU% since the previous call, RSS, and GPU fields when available."""

    def __init__(self) -> None:
        self.proc = psutil.Process()
        self.proc.cpu_percent(None)  # prime: the first reading is relative to this call
        self.nvml: NvmlProbe | None = None
        self._error_reported = False

    def use_gpu(self, cuda_index: int | None) -> None:
        if self.nvml is None:
            self.nvml = NvmlProbe(cuda_index)

    def sample(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        try:
            out["cpu"] = round(self.proc.cpu_percent(None), 1)
            out["rss"] = self.proc.memory_info().rss
        except psutil.Error:
            pass
        if self.nvml is not None:
            gpu = self.nvml.sample()
            out.update(gpu)
            if not gpu and self.nvml.error and not self._error_reported:
                out["gpu_error"] = self.nvml.error
                self._error_reported = True
        return out

    def close(self) -> None:
        if self.nvml is not None:
            self.nvml.close()
