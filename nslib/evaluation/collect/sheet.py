"""The measured GPU's datasheet, from what the driver reports, completed by the vendor's figures.

The driver gives the SM count, memory size, L2 size, the maximum SM and memory clocks, the
memory bus width and the default power limit (through NVML when ``nvidia-ml-py`` is installed).
From these: ``Freq`` (max SM clock), ``Mem_Bw`` (2 transfers per memory clock over the bus),
``TDP`` (default power limit), ``Core_Per_SM`` (FP32 lanes per SM of the compute capability,
the architectures' published figure) and ``SingleFLOPs = 2 x SMs x lanes x Freq``.

What the driver cannot report must come from the vendor's datasheet (``vendor``, a NeuSight-format
JSON): the dense tensor-core peak ``Bf16FLOPs``, the GPU-to-GPU ``Link_Bw``, and the FP32 peak
and board power where the vendor's differ from the clock arithmetic. Vendor figures win; the
record says where each figure came from. On the CPU (the tests), cores play the SMs, and the
FP32 and BF16 peaks and the bandwidth are the probe's measured rates, marked as such.
"""
from __future__ import annotations

import os
import platform

# FP32 lanes per SM by compute capability major (and minor where it differs), the figures of the
# CUDA programming guide's arithmetic-throughput table
_LANES = {(6, 0): 64, (6, 1): 128, (7, 0): 64, (7, 5): 64, (8, 0): 64, (8, 6): 128,
          (8, 7): 128, (8, 9): 128, (9, 0): 128, (10, 0): 128, (12, 0): 128}
VENDOR_ONLY = ("Bf16FLOPs", "Link_Bw")


def lanes_per_sm(major: int, minor: int) -> int | None:
    """FP32 lanes per SM of compute capability ``major.minor`` (None when not tabulated)."""
    return _LANES.get((major, minor)) or _LANES.get((major, 0))


def _nvml(index: int) -> dict:
    """Clocks (MHz), bus width (bits) and default power limit (W) from NVML; {} without it."""
    try:
        import pynvml
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(index)
        out = {"sm_mhz": pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM),
               "mem_mhz": pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM),
               "driver": pynvml.nvmlSystemGetDriverVersion()}
        try:
            out["bus_bits"] = pynvml.nvmlDeviceGetMemoryBusWidth(h)
        except Exception:  # noqa: BLE001 - older drivers lack the call
            pass
        try:
            out["tdp_w"] = pynvml.nvmlDeviceGetPowerManagementDefaultLimit(h) / 1000.0
        except Exception:  # noqa: BLE001
            pass
        return {k: (v.decode() if isinstance(v, bytes) else v) for k, v in out.items()}
    except Exception:  # noqa: BLE001 - no NVML: the vendor sheet must fill the gaps
        return {}


def _cuda_sheet(device: str) -> tuple[dict, dict]:
    import torch

    index = torch.device(device).index or 0
    p = torch.cuda.get_device_properties(index)
    nv = _nvml(index)
    lanes = lanes_per_sm(p.major, p.minor)
    sheet = {"Device": p.name, "Dev_Mem": round(p.total_memory / 1e9, 1),
             "Num_Sm": p.multi_processor_count, "Core_Per_SM": lanes,
             "L2Cache": round(p.L2_cache_size / 2**20, 1)}
    if nv.get("sm_mhz"):
        sheet["Freq"] = nv["sm_mhz"]
        if lanes:
            sheet["SingleFLOPs"] = round(2 * p.multi_processor_count * lanes * nv["sm_mhz"] / 1e3)
    if nv.get("mem_mhz") and nv.get("bus_bits"):
        sheet["Mem_Bw"] = round(2 * nv["mem_mhz"] * nv["bus_bits"] / 8 / 1e3)
    if nv.get("tdp_w"):
        sheet["TDP"] = nv["tdp_w"]
    facts = {"compute_capability": f"{p.major}.{p.minor}", **nv}
    return sheet, facts


def _cpu_sheet(probe: dict) -> tuple[dict, dict]:
    cores = os.cpu_count() or 1
    mhz, l2 = 0.0, 1.0
    try:
        with open("/proc/cpuinfo") as f:
            mhz = max(float(line.split(":")[1]) for line in f if line.startswith("cpu MHz"))
    except (OSError, ValueError):
        pass
    try:
        with open("/sys/devices/system/cpu/cpu0/cache/index2/size") as f:
            l2 = float(f.read().strip().rstrip("K")) / 1024
    except (OSError, ValueError):
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    sheet = {"Device": f"CPU {platform.machine()} {cores}-core", "Dev_Mem": round(mem, 1),
             "Mem_Bw": round(probe["bytes_per_s"] / 1e9, 1), "Num_Sm": cores,
             "Core_Per_SM": 1, "Freq": round(mhz or 1000.0),
             "SingleFLOPs": round(probe["flops_per_s"] / 1e9, 1), "L2Cache": round(l2, 2),
             "Bf16FLOPs": round(probe["bf16_flops_per_s"] / 1e9, 1)}
    facts = {"measured_not_datasheet": ["Mem_Bw", "SingleFLOPs", "Bf16FLOPs"],
             "clock_unknown": not mhz}
    return sheet, facts


def datasheet(device: str, probe: dict, vendor: dict | None = None) -> tuple[dict, dict]:
    """(NeuSight-format datasheet, provenance of its figures) of the measured device.

    ``probe``: :func:`nslib.evaluation.collect.sweep.probe`'s rates (used on the CPU).
    ``vendor``: the vendor's datasheet (its figures replace the driver's, but the ``Device``
    name stays the one the driver reports, which the kernel rows carry). Raises ValueError
    naming the missing figures when the result lacks a required one.
    """
    from nslib.data.gpus import gpu_from_dict

    sheet, facts = _cuda_sheet(device) if device.startswith("cuda") else _cpu_sheet(probe)
    origin, driver_sheet = {k: "driver" for k in sheet}, dict(sheet)
    for k, v in (vendor or {}).items():
        if v is not None and k != "Device" and not str(k).startswith("_"):
            sheet[k], origin[k] = v, "vendor datasheet"
    try:
        gpu_from_dict(sheet, source="the collected datasheet")
    except ValueError as e:
        raise ValueError(f"{e}: the driver does not report it; pass the vendor's figures with "
                         "--datasheet FILE (a NeuSight-format JSON)") from None
    missing = [k for k in VENDOR_ONLY if k not in sheet]
    return sheet, {"origin": origin, "driver": facts, "driver_sheet": driver_sheet,
                   "vendor_figures_missing": missing}
