"""A record of the machine a benchmark ran on: cores, memory, CPU model,
kernel, git, Python and Aspen versions, and the date."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import re
import socket
import subprocess
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Optional


@dataclass
class MachineInfo:
    hostname: str = ""
    tag: str = ""                  # the folder name part: --machine, $ASPEN_BENCH_MACHINE or the hostname
    cores: int = 0
    memory_bytes: int = 0
    cpu_model: str = ""
    kernel: str = ""
    os: str = ""
    git_version: str = ""
    python_version: str = ""
    aspen_version: str = ""
    gunicorn_version: str = ""
    apache_version: str = ""
    date: str = ""                 # UTC, ISO 8601

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "MachineInfo":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / 2**30

    def summary(self) -> str:
        return (f"{self.cores} cores, {self.memory_gib:.1f} GiB, {self.cpu_model or 'unknown CPU'}, "
                f"{self.os or 'unknown OS'} (kernel {self.kernel}), git {self.git_version}, "
                f"Python {self.python_version}, Aspen {self.aspen_version}")


def _memory_bytes() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _os_name() -> str:
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                return line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return platform.system()


def _run(argv: list[str]) -> str:
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=10)
        return (p.stdout or p.stderr).strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _git_version() -> str:
    out = _run(["git", "--version"])
    m = re.search(r"(\d+\.\d+[\w.]*)", out)
    return m.group(1) if m else out


def _apache_version() -> str:
    for prog in ("apache2", "httpd", "/usr/sbin/apache2"):
        out = _run([prog, "-v"])
        m = re.search(r"Apache/(\S+)", out)
        if m:
            return m.group(1)
    return ""


def _module_version(name: str) -> str:
    try:
        from importlib.metadata import version
        return version(name)
    except Exception:
        return ""


def _aspen_version() -> str:
    try:
        import aspen_cgi
        return aspen_cgi.__version__
    except Exception:
        return _module_version("aspen-cgi")


def safe_tag(text: str) -> str:
    """A folder-safe machine tag."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "machine"


def collect(tag: Optional[str] = None) -> MachineInfo:
    host = socket.gethostname()
    return MachineInfo(
        hostname=host,
        tag=safe_tag(tag or os.environ.get("ASPEN_BENCH_MACHINE") or host),
        cores=os.cpu_count() or 0,
        memory_bytes=_memory_bytes(),
        cpu_model=_cpu_model(),
        kernel=platform.release(),
        os=_os_name(),
        git_version=_git_version(),
        python_version=platform.python_version(),
        aspen_version=_aspen_version(),
        gunicorn_version=_module_version("gunicorn"),
        apache_version=_apache_version(),
        date=_dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
    )
