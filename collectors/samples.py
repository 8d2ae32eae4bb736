"""Stack samples as serwatt sees them, independent of the sampler that took them.

A *sample* is one observation of one thread's Python stack at one instant. Frames
are ordered leaf first (innermost call first), the same order as `py-spy dump --json`.
Times are host wall-clock seconds since the Unix epoch, so samples line up with
RAPL reads and NVML timestamps taken on the same host.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class Frame:
    """One stack frame. `module` is the shared object path for native frames, else None."""

    name: str
    filename: str
    line: int
    module: str | None = None

    @property
    def is_native(self) -> bool:
        return self.module is not None


@dataclass(frozen=True)
class Sample:
    """One thread's stack at one instant.

    `tid` is the kernel thread id when known (the key for per-thread CPU time in
    /proc/<pid>/task/<tid>/stat); `thread_id` is the Python thread id (pthread_t)
    as py-spy reports it. `partial` marks a stack that py-spy could not read to its
    root (possible in --nonblocking mode).
    """

    pid: int
    tid: int | None
    thread_id: int
    thread_name: str | None
    t: float
    frames: tuple[Frame, ...]
    active: bool | None = None
    partial: bool = False


@dataclass(frozen=True)
class SamplerErrors:
    """Failures of the sampler itself, counted, never hidden."""

    pyspy_samples: int = 0  # what py-spy said it took ("Samples: N")
    pyspy_errors: int = 0  # what py-spy said failed ("Errors: M")
    partial_stacks: int = 0
    behind_s: float = 0.0  # worst "behind in sampling" lag seen in the window
    notes: tuple[str, ...] = field(default_factory=tuple)

    def with_run(self, other: SamplerErrors) -> SamplerErrors:
        """These counts plus another py-spy run's over the same window (its samples,
        errors and worst lag; partial stacks and notes stay this run's)."""
        return replace(
            self,
            pyspy_samples=self.pyspy_samples + other.pyspy_samples,
            pyspy_errors=self.pyspy_errors + other.pyspy_errors,
            behind_s=max(self.behind_s, other.behind_s),
        )
