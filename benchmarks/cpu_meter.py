"""CPU seconds of the processes a browser benchmark runs beside a training run: the kernels of its jupyter server,
chromium (driven by playwright, a child of this process) and the jupyter server itself, from psutil's counters."""

from __future__ import annotations

import time
from pathlib import Path


def _cpu(processes) -> float:
    total = 0.0
    for p in processes:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except Exception:  # gone meanwhile
            pass
    return total


def kernels(folder: Path) -> list:
    """The kernels of this benchmark's server (their connection files live in its runtime folder)."""
    import psutil

    found = []
    for p in psutil.process_iter(["cmdline"]):  # (process_iter passes over processes that end meanwhile)
        cmd = " ".join(p.info["cmdline"] or [])
        if "ipykernel" in cmd and str(folder) in cmd:
            found.append(p)
    return found


def _children(recursive: bool, keep) -> list:
    """This process's children that `keep` accepts; one that ends while being looked at is passed over (chromium
    starts and ends helper processes all the time)."""
    import psutil

    found = []
    for p in psutil.Process().children(recursive=recursive):
        try:
            if keep(p):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return found


def chromium() -> list:
    return _children(True, lambda p: "chrom" in p.name().lower())


def lab_server() -> list:
    """This benchmark's jupyter server (a child of this process; its kernels are counted apart)."""
    return _children(False, lambda p: "jupyterlab" in " ".join(p.cmdline()))


class CpuMeter:
    """CPU seconds spent by the kernel, chromium and the jupyter server between `start` and `stop`."""

    def __init__(self, folder: Path):
        self.folder = folder

    def start(self) -> None:
        self.kernel, self.browser, self.server = kernels(self.folder), chromium(), lab_server()
        self.t0, self.k0, self.b0 = time.monotonic(), _cpu(self.kernel), _cpu(self.browser)
        self.s0 = _cpu(self.server)

    def stop(self) -> dict:
        wall = time.monotonic() - self.t0
        kernel, browser = _cpu(self.kernel) - self.k0, _cpu(self.browser) - self.b0
        server = _cpu(self.server) - self.s0
        return {
            "wall_s": round(wall, 2),
            "kernel_cpu_s": round(kernel, 2),
            "chromium_cpu_s": round(browser, 2),
            "kernel_core_share": round(kernel / wall, 4),
            "chromium_core_share": round(browser / wall, 4),
            "server_cpu_s": round(server, 2),
            "server_core_share": round(server / wall, 4),
        }
