"""The one free-port helper (ortlab/netutil.py): ZeRO's one-process group uses it; the local launcher picks no port."""

from __future__ import annotations

import socket

from ortlab import netutil


def test_free_port_is_a_loopback_port_that_can_be_bound():
    port = netutil.free_port()
    assert 1024 <= port <= 65535
    with socket.socket() as s:
        s.bind((netutil.LOOPBACK, port))  # free: the helper closed its socket


def test_zero_uses_the_one_helper_and_the_launcher_picks_no_port():
    from ortlab.accel import zero
    from ortlab.runner import local

    assert zero.free_port is netutil.free_port
    # torchrun's store binds its port itself, at bind time (ortlab.runner.torchrun): no port picked and closed first.
    assert not hasattr(local, "free_port") and not hasattr(local, "_free_port")
