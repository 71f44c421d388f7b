"""The workload contract: `WorkloadContext` in, `list[Measurement]` out, and the
registry every family module adds its workloads to with `@register(name)`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from ..model import Measurement, TargetInfo


def _no_progress(done: int, total: Optional[int] = None, label: Optional[str] = None) -> None:
    pass


@dataclass(kw_only=True)
class WorkloadContext:
    """Everything a workload may use. Targets are already running over copies of
    the same repository; `repo` is its name under every target (a RepoInfo is
    accepted too and reduced to its directory name)."""
    targets: list[TargetInfo]
    repo: Any = "bench.git"
    proxies: dict[str, object] = field(default_factory=dict)     # target name -> .mark()/.since(mark)
    roots: dict[str, Optional[Path]] = field(default_factory=dict)  # target name -> server repository root
    workdir: Path = Path("/tmp/aspen-bench")                    # scratch, owned by this workload
    quick: bool = False
    params: dict = field(default_factory=dict)                  # see the report / module docs; protocol: 2 (default) or 0
    procs: dict[str, list[int]] = field(default_factory=dict)   # target name -> server pids (procstats roots)
    progress: Callable[..., None] = _no_progress                # progress(done, total, label), as bench.progress.Progress
    trunk: str = "refs/heads/main"                              # the branch HEAD names in the repository (--repo: any)

    @property
    def trunk_name(self) -> str:
        return self.trunk[len("refs/heads/"):]

    def __post_init__(self) -> None:
        if not isinstance(self.repo, str):
            self.repo = Path(getattr(self.repo, "path", self.repo)).name
        self.workdir = Path(self.workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        from .. import gitclient
        proto = self.params.get("protocol")
        gitclient.set_default_protocol(2 if proto is None else int(proto))

    def param(self, name: str, default: Any, quick: Any = None) -> Any:
        """params[name] if given, else QUICK (when quick and given) or DEFAULT."""
        if self.params.get(name) is not None:
            return self.params[name]
        return quick if (self.quick and quick is not None) else default


Workload = Callable[[WorkloadContext], list[Measurement]]
WORKLOADS: dict[str, Workload] = {}


def register(name: str) -> Callable[[Workload], Workload]:
    def add(fn: Workload) -> Workload:
        WORKLOADS[name] = fn
        return fn
    return add
