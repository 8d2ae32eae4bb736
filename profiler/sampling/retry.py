"""After a window of a target failed: forget the target, try it again (and when), or give
up on it. The one rule both drivers apply; each holds its own `RetryPolicy` values.

A failure's kind is its SamplingError's `kind` (collectors/pyspy/runner.py). The target's
own kinds (TARGET_KINDS: it is gone, not Python, a Python py-spy cannot read, ptrace
refused) say nothing is wrong with serwatt; any other kind (py-spy crashed or was killed,
its output unreadable) is serwatt's own fault, and trying again at once would spin.

- A target that is gone is forgotten.
- A process that is only just starting (`young`: its executable is Python, but py-spy
  finds no interpreter yet) is tried again after `young_pause_s`, up to `young_tries`
  times in a row.
- A target that refused is tried again after `refused_retry_s`, or given up on when it
  is None (a profile session has one command to profile: it says why and goes on).
- serwatt's own fault, the n-th in a row, is tried again after
  min(fault_cap_s, fault_unit_s x (2^(n-1) - 1)): at once the first time, then backing
  off; or given up on when fault_unit_s is None.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

TARGET_KINDS = frozenset({"target_gone", "not_python", "unsupported_python", "ptrace_denied"})


@dataclass(frozen=True)
class Retry:
    action: Literal["forget", "retry", "give_up"]
    after_s: float = 0.0


FORGET = Retry("forget")
GIVE_UP = Retry("give_up")


@dataclass(frozen=True)
class RetryPolicy:
    refused_retry_s: float | None = None
    fault_unit_s: float | None = None
    fault_cap_s: float = float("inf")
    young_tries: int = 0
    young_pause_s: float = 0.3

    def after(self, kind: str, *, in_a_row: int, young: bool = False) -> Retry:
        """What to do after the `in_a_row`-th failure in a row of this kind class (1 for
        the first)."""
        if kind == "target_gone":
            return FORGET
        if kind == "not_python" and young and in_a_row <= self.young_tries:
            return Retry("retry", self.young_pause_s)
        if kind in TARGET_KINDS:
            return GIVE_UP if self.refused_retry_s is None else Retry("retry", self.refused_retry_s)
        if self.fault_unit_s is None:
            return GIVE_UP
        return Retry("retry", min(self.fault_cap_s, self.fault_unit_s * (2 ** (in_a_row - 1) - 1)))
