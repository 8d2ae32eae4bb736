"""sd_notify: real AF_UNIX datagrams, as systemd would receive them."""

from __future__ import annotations

import os
import socket

import pytest

from serwatt.profiler.service.sdnotify import SdNotifier


@pytest.fixture()
def notify_socket(tmp_path):
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(5)
    yield path, sock
    sock.close()


def test_ready_watchdog_stopping_reach_the_socket(notify_socket):
    path, sock = notify_socket
    n = SdNotifier({"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "3000000"})
    assert n.enabled and n.watchdog_interval_s == 3.0
    assert n.ready("watching 2 targets")
    assert sock.recv(4096) == b"READY=1\nSTATUS=watching 2 targets"
    assert n.watchdog()
    assert sock.recv(4096) == b"WATCHDOG=1"
    assert n.stopping()
    assert sock.recv(4096) == b"STOPPING=1"
    assert n.status("reloaded")
    assert sock.recv(4096) == b"STATUS=reloaded"


def test_abstract_namespace_socket():
    name = f"serwatt-test-{os.getpid()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(b"\0" + name.encode())
    sock.settimeout(5)
    try:
        assert SdNotifier({"NOTIFY_SOCKET": "@" + name}).ready()
        assert sock.recv(4096) == b"READY=1"
    finally:
        sock.close()


def test_outside_systemd_everything_is_a_noop():
    n = SdNotifier({})
    assert not n.enabled
    assert n.watchdog_interval_s is None
    assert n.ready() is False and n.watchdog() is False and n.stopping() is False


def test_watchdog_off_without_usec_or_for_another_pid(notify_socket):
    path, sock = notify_socket
    assert SdNotifier({"NOTIFY_SOCKET": str(path)}).watchdog() is False
    other = SdNotifier(
        {"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "1000000", "WATCHDOG_PID": "1"}
    )
    assert other.watchdog_interval_s is None and other.watchdog() is False
    assert (
        SdNotifier({"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "x"}).watchdog_interval_s is None
    )
    mine = SdNotifier(
        {"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "500000", "WATCHDOG_PID": str(os.getpid())}
    )
    assert mine.watchdog_interval_s == 0.5


def test_send_failure_is_reported_not_raised(tmp_path, caplog):
    n = SdNotifier({"NOTIFY_SOCKET": str(tmp_path / "nobody-listens.sock")})
    assert n.ready() is False
    assert n.ready() is False
    warnings = [r for r in caplog.records if "sd_notify" in r.getMessage()]
    assert len(warnings) == 1  # logged once, not on every ping
