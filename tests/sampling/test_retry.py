"""profiler/sampling/retry.py: the one rule both drivers apply after a failed window."""

from __future__ import annotations

from serwatt.profiler.profile.session import SESSION_RETRY
from serwatt.profiler.sampling.retry import FORGET, GIVE_UP, Retry, RetryPolicy

DAEMON = RetryPolicy(refused_retry_s=60.0, fault_unit_s=5.0, fault_cap_s=60.0)


def test_the_daemon_backs_off_its_own_faults_and_waits_out_refusals() -> None:
    # own faults: at once, then 5, 15, 35 s (window x (2^(n-1) - 1)), capped at 60
    assert [DAEMON.after("sampler_failed", in_a_row=n).after_s for n in range(1, 7)] == [
        0.0, 5.0, 15.0, 35.0, 60.0, 60.0
    ]  # fmt: skip
    for kind in ("not_python", "unsupported_python", "ptrace_denied"):
        assert DAEMON.after(kind, in_a_row=3, young=True) == Retry("retry", 60.0), kind
    assert DAEMON.after("target_gone", in_a_row=1) == FORGET


def test_the_session_retries_only_a_process_that_is_starting() -> None:
    for n in range(1, 11):
        assert SESSION_RETRY.after("not_python", in_a_row=n, young=True) == Retry("retry", 0.3)
    assert SESSION_RETRY.after("not_python", in_a_row=11, young=True) == GIVE_UP
    assert SESSION_RETRY.after("not_python", in_a_row=1, young=False) == GIVE_UP
    for kind in ("sampler_failed", "ptrace_denied", "unsupported_python"):
        assert SESSION_RETRY.after(kind, in_a_row=1) == GIVE_UP, kind
    assert SESSION_RETRY.after("target_gone", in_a_row=1) == FORGET
