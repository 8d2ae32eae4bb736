"""Each target's classified stacks pushed to Grafana Pyroscope once a period, as pprof.

The main loop hands every applied window to `PushSink` (a window sink beside the ledger's)
and calls `PyroscopePusher.tick` after each slot. When a period has passed, tick cuts
each target's stacks of the period into one job on a bounded queue and returns at once:
the main loop never waits on the network. One thread of the pusher's own takes the jobs,
encodes each as gzip'd pprof (the CLI hands in profiler/profile/pprof.py's encoder, the
bytes `serwatt profile --pprof` writes; this layer may not import it) and posts it to
Pyroscope's HTTP ingest API:

    POST URL/ingest?name=APP{target=T,host=H,LABEL=V...}&from=UNIX&until=UNIX
         &format=pprof&spyName=serwatt&sampleRate=HZ
    Content-Type: application/octet-stream        body: the gzip'd pprof

`from`/`until` bound the windows applied in the period (whole seconds, outward); Pyroscope
takes the sample types from the pprof itself (cpu, energy, gpu_wait, samples; labels
codepath and direction on every sample). Each request has a total deadline, connect to
last byte (profiler/deadline_http.py: http(s) only, a redirect elsewhere refused). A push
that fails is dropped, not retried (the next period's profile is newer), and counted in
`serwatt_push_errors_total{kind}`: timeout, connect, http_status, redirect (a redirect
turns urllib's POST into a GET without the profile, so one that was followed is a loss
too), queue_full (the thread is behind: the new job is dropped), credentials (the file
could not be read at push time), encode (a bug).

Only the HTTP ingest of Pyroscope is spoken. Parca ingests pprof over gRPC
(`ProfileStoreService.WriteRaw`), which would need a gRPC client and Parca's generated
protos; it is not implemented.
"""

from __future__ import annotations

import base64
import logging
import math
import queue
import re
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from serwatt.profiler.attribution.episodes import Episode
from serwatt.profiler.attribution.window import AttributedWindow
from serwatt.profiler.deadline_http import RedirectRefused, deadline_opener
from serwatt.profiler.safeio import InputFileError, read_bounded
from serwatt.profiler.service.config_pyroscope import (
    MAX_CREDENTIAL_BYTES,
    PYROSCOPE_LABEL_VALUE_RE,
    PyroscopeConfig,
)
from serwatt.profiler.service.ledger import Ledger
from serwatt.profiler.terminal_escape import escape_text

log = logging.getLogger("serwatt.pyroscope")

# Jobs waiting for the push thread; past it a new job is dropped (queue_full). Each job
# holds one target's stacks of one period (bounded by the accumulator's own cap).
MAX_QUEUED = 16
# What is read of Pyroscope's answer (it answers 200 with an empty body)
MAX_ANSWER_BYTES = 64 * 1024
CONTENT_TYPE = "application/octet-stream"
SPY_NAME = "serwatt"
_HOST_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


class StackAccumulator(Protocol):
    """One target's classified stacks over a period (profiler/profile/stack_profile.py's
    StackProfile)."""

    def add(self, window: AttributedWindow) -> None: ...

    def __len__(self) -> int: ...


@dataclass(frozen=True)
class ProfileEncoder:
    """How a period's stacks become the pushed bytes. The CLI gives StackProfile and
    pprof_bytes (profiler/cli/daemon.py): the daemon and the profile session are drivers
    that may not import each other, and the CLI sees both."""

    new: Callable[[], StackAccumulator]
    # (stacks, started_at (epoch s), duration_s, rate_hz) -> gzip'd pprof
    encode: Callable[[Any, float, float, float], bytes]


@dataclass(frozen=True)
class PushJob:
    target: str
    stacks: Any  # a StackAccumulator, no longer added to
    started_at: float
    ended_at: float
    rate_hz: float
    labels: tuple[tuple[str, str], ...]  # Pyroscope's series labels, target first


def short_host() -> str:
    """The host label and `{host}`: the short host name, as the run ids' {host}."""
    return _HOST_UNSAFE.sub("_", socket.gethostname().split(".")[0]) or "unknown"


class PyroscopePusher:
    def __init__(
        self,
        config: PyroscopeConfig,
        encoder: ProfileEncoder,
        ledger: Ledger,
        *,
        target_labels: Mapping[str, Mapping[str, str]],
        started_at: float,
        wall_clock: Callable[[], float],
        host: str | None = None,
    ) -> None:
        """started_at: the first period's start (epoch s); wall_clock: the daemon's
        clock.time, which stamps the last period at close. target_labels: each target's
        static labels (targets[].labels, checked by the config for Pyroscope's syntax).
        Only a request's deadline reads real time (time.monotonic): a socket's timeout is
        the kernel's, whatever clock the daemon runs on."""
        self.config = config
        self._encoder = encoder
        self._ledger = ledger
        self._host = host or short_host()
        self._labels = dict(target_labels)
        self._period_start = started_at
        self._wall_clock = wall_clock
        self._rate_hz = 0.0  # the windows' rate at the last tick (0: none yet)
        self._stacks: dict[str, StackAccumulator] = {}
        self._queue: queue.Queue[PushJob | None] = queue.Queue(MAX_QUEUED)
        self._thread = threading.Thread(target=self._run, name="serwatt-push", daemon=True)
        self.pushed = 0  # pushes the server accepted (2xx)

    # ------------------------------------------------------------ main thread

    def start(self) -> None:
        self._thread.start()

    def set_targets(self, target_labels: Mapping[str, Mapping[str, str]]) -> None:
        self._labels = dict(target_labels)

    def add(self, target: str, window: AttributedWindow) -> None:
        acc = self._stacks.get(target)
        if acc is None:
            acc = self._stacks[target] = self._encoder.new()
        acc.add(window)

    def tick(self, now: float, rate_hz: float) -> None:
        """After a slot: once a period has passed, queue each target's profile of it."""
        self._rate_hz = rate_hz
        if now - self._period_start >= self.config.period_s:
            self._cut(now, rate_hz)

    def close(self) -> None:
        """Queue what the last, partial period holds, and give the thread one request's
        timeout in all to send what it can; what is left then is dropped (the thread is
        a daemon thread: it never holds the exit)."""
        if self._thread.is_alive():
            deadline = time.monotonic() + self.config.timeout_s
            self._cut(self._wall_clock(), self._rate_hz)
            try:
                self._queue.put(None, timeout=self.config.timeout_s)
            except queue.Full:
                return
            self._thread.join(max(0.0, deadline - time.monotonic()))

    def _cut(self, now: float, rate_hz: float) -> None:
        stacks, self._stacks = self._stacks, {}
        start, self._period_start = self._period_start, now
        for target, acc in sorted(stacks.items()):
            if not len(acc):
                continue
            labels = {"target": target, "host": self._host}
            # the config refuses other values with a push; a reload that dropped the push
            # from the file keeps this one running unchecked, so they are left out here
            labels |= {
                k: v
                for k, v in sorted(self._labels.get(target, {}).items())
                if PYROSCOPE_LABEL_VALUE_RE.match(v)
            }
            job = PushJob(target, acc, start, now, rate_hz, tuple(labels.items()))
            try:
                self._queue.put_nowait(job)
            except queue.Full:
                self._error("queue_full", f"{target}: the push thread is behind; dropped")

    # ------------------------------------------------------------ push thread

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            try:
                self.push(job)
            except Exception:  # a bug must not end the thread: later periods still go
                log.exception("pushing %s to Pyroscope failed", job.target)
                self._error("internal", job.target)

    def request_url(self, job: PushJob) -> str:
        app = self.config.app_name.format(target=job.target, host=self._host)
        name = app + "{" + ",".join(f"{k}={v}" for k, v in job.labels) + "}"
        query = {
            "name": name,
            "from": str(math.floor(job.started_at)),
            "until": str(math.ceil(job.ended_at)),
            "format": "pprof",
            "spyName": SPY_NAME,
        }
        if job.rate_hz > 0:
            query["sampleRate"] = str(round(job.rate_hz))
        return self.config.ingest_url() + "?" + urllib.parse.urlencode(query)

    def push(self, job: PushJob) -> bool:
        """One job to the server (on the push thread); True when it took it."""
        try:
            body = self._encoder.encode(
                job.stacks, job.started_at, job.ended_at - job.started_at, job.rate_hz
            )
        except Exception:
            log.exception("encoding the profile of %s failed", job.target)
            self._error("encode", job.target)
            return False
        try:
            headers = self._headers()
        except InputFileError as exc:
            self._error("credentials", str(exc))
            return False
        url = self.request_url(job)
        request = urllib.request.Request(url, data=body, headers=headers, method="POST")
        with deadline_opener(time.monotonic() + self.config.timeout_s) as (opener, watchdog):
            try:
                with opener.open(request) as answer:
                    answer.read(MAX_ANSWER_BYTES)
                    followed = answer.geturl() != url
            except RedirectRefused as exc:
                self._error("redirect", f"{job.target}: redirected off http(s): {exc}")
                return False
            except urllib.error.HTTPError as exc:
                self._error("http_status", f"{job.target}: HTTP {exc.code} {exc.reason}")
                return False
            except (urllib.error.URLError, OSError) as exc:
                reason = getattr(exc, "reason", exc)
                timed_out = watchdog.fired or isinstance(reason, TimeoutError)
                self._error(
                    "timeout" if timed_out else "connect",
                    f"{job.target}: {'no answer within timeout_s' if timed_out else reason}",
                )
                return False
        if followed:
            self._error("redirect", f"{job.target}: the server redirected the push")
            return False
        self.pushed += 1
        log.debug("pushed %s (%d bytes) to %s", job.target, len(body), self.config.url)
        return True

    def _headers(self) -> dict[str, str]:
        cfg = self.config
        headers = {"Content-Type": CONTENT_TYPE, "User-Agent": f"{SPY_NAME}-daemon"}
        if cfg.tenant_id:
            headers["X-Scope-OrgID"] = cfg.tenant_id
        for file, scheme in ((cfg.basic_auth_file, "Basic"), (cfg.bearer_token_file, "Bearer")):
            if file is None:
                continue
            secret = read_bounded(file, max_bytes=MAX_CREDENTIAL_BYTES).decode(errors="replace")
            secret = secret.strip()
            if scheme == "Basic":
                secret = base64.b64encode(secret.encode()).decode()
            headers["Authorization"] = f"{scheme} {secret}"
        return headers

    def _error(self, kind: str, detail: str) -> None:
        self._ledger.add_push_error(kind)
        # the detail may carry the server's words (a reason phrase, a redirect target)
        log.warning("Pyroscope push dropped (%s): %s", kind, escape_text(detail))


@dataclass(frozen=True)
class PushSink:
    """One target's windows into the pusher's stacks of the period."""

    pusher: PyroscopePusher
    target: str

    def on_window(self, window: AttributedWindow) -> None:
        self.pusher.add(self.target, window)

    def on_episodes(self, episodes: Sequence[Episode]) -> None:
        """Pushes carry stacks; episodes go to the record."""
