"""Addresses and ports: which ports a process listens on, and whether the configured address and ports can be
taken (checked before a running server is stopped, so a bad setting leaves it serving)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from hf2triton import host
from hf2triton.errors import UserError
from hf2triton.triton.settings import Settings


def listening_ports(pid: int) -> set[int]:
    """TCP ports `pid` listens on (from /proc/net/tcp{,6} and its socket inodes)."""
    try:
        inodes = {os.readlink(f"/proc/{pid}/fd/{fd}")[8:-1] for fd in os.listdir(f"/proc/{pid}/fd")}
    except OSError:
        return set()
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 9 and fields[3] == "0A" and fields[9] in inodes:  # 0A = LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def cannot_listen(host_address: str) -> str:
    """Why this machine cannot listen on `host_address` ('' when it can)."""
    family = socket.AF_INET6 if ":" in host_address else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.bind((host_address.strip("[]"), 0))
    except (OSError, UnicodeError) as err:
        return str(err)
    return ""


LISTEN_FIX = "use 127.0.0.1 (this machine only), 0.0.0.0 (every interface) or an address of this machine"


def check_can_listen(settings: Settings, held_by_replaced: list[int]) -> None:
    """Before a running server is stopped: the new host must be an address this machine can listen on, and
    each port must be free or held by a server about to be replaced (so a bad host or a taken port leaves
    the old server serving)."""
    problem = cannot_listen(settings.host)
    if problem:
        what = f"server.host = {settings.host!r}: this machine cannot listen on that address ({problem}); nothing was stopped"
        raise UserError(what, LISTEN_FIX)
    ours = set().union(*(listening_ports(pid) for pid in held_by_replaced)) if held_by_replaced else set()
    check_ports_free(settings, ours, "; the running server keeps serving")


def check_ports_free(settings: Settings, held_by_us: set[int] | None = None, note: str = "") -> None:
    """Every port free (or in `held_by_us`), else a UserError naming the config key."""
    for key, port in settings.ports.items():
        if port not in (held_by_us or set()) and not host.port_is_free(settings.host, port):
            raise UserError(
                f"port {port} (server.{key}) on {settings.host} is already in use by another program{note}",
                f"stop that program or set server.{key} in config.yaml to a free port",
            )
