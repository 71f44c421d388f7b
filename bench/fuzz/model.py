"""What the fuzz modules pass between them: a target, a session's shared
state, a verdict, and a crash record."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ContextManager, Optional

from hypothesis.strategies import SearchStrategy

from .corpus import Corpus

Run = Callable[[Any], str]    # one input -> its outcome label; raises on a crash


class Crash(Exception):
    """An input broke a promise: not a documented error, but a traceback,
    an undeliberate 5xx, a hang, a dead worker, or a wrong answer."""

    def __init__(self, kind: str, detail: str = ""):
        super().__init__(f"{kind}: {detail[:200]}" if detail else kind)
        self.kind = kind
        self.detail = detail


@dataclass
class Session:
    """What every target of one run shares: the captured corpus, a fresh
    repository root (fuzz.git) and a scratch directory."""
    corpus: Corpus
    root: Path
    workdir: Path


@dataclass(frozen=True)
class Target:
    name: str
    doc: str
    strategy: Callable[[Session], SearchStrategy]
    open: Callable[[Session], ContextManager[Run]]
    slow: bool = False             # runs git or a server: fewer inputs per second


@dataclass
class CrashRecord:
    target: str
    signature: str                  # what makes two crashes the same bug
    kind: str
    detail: str
    input: Any
    count: int = 1


@dataclass
class TargetResult:
    name: str
    tried: int = 0
    seconds: float = 0.0
    outcomes: dict[str, int] = field(default_factory=dict)
    crashes: list[CrashRecord] = field(default_factory=list)
    crash_count: int = 0
    error: Optional[str] = None     # the target could not run at all

    @property
    def rate(self) -> float:
        return self.tried / self.seconds if self.seconds > 0 else 0.0


_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"|[0-9a-f]{40}|\d+")


def label(e: BaseException) -> str:
    """A documented error as an outcome: its type and its message with the
    client's words and the numbers taken out, so that outcomes group."""
    text = _QUOTED.sub("_", str(e).splitlines()[0] if str(e) else "")
    return f"{type(e).__name__}: {text[:60]}"
