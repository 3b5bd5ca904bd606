"""The one free-port helper (ortlab/netutil.py) that the launcher and ZeRO's one-process group share."""

from __future__ import annotations

import socket

from ortlab import netutil


def test_free_port_is_a_loopback_port_that_can_be_bound():
    port = netutil.free_port()
    assert 1024 <= port <= 65535
    with socket.socket() as s:
        s.bind((netutil.LOOPBACK, port))  # free: the helper closed its socket


def test_the_launcher_and_zero_use_the_one_helper():
    from ortlab.accel import zero
    from ortlab.runner import local

    assert local.free_port is netutil.free_port  # torchrun's --master_port (the local launcher)
    assert zero.free_port is netutil.free_port
    assert not hasattr(local, "_free_port")
