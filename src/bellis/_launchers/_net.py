"""Which address the server advertises when its workers run on other machines.

``detect_reachable_host()`` picks a non-loopback IPv4 of this machine that a socket can really
listen on and be reached at; ``resolve_interface()`` maps an interface name (``eth0``, ``ib0``)
to its IPv4. Every choice is logged at INFO on the ``bellis`` logger, and a fallback to loopback
is a WARNING that says how to pick the address by hand.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import socket
import struct
import subprocess
import sys

__all__ = ["detect_reachable_host", "resolve_interface"]

logger = logging.getLogger("bellis")

#: TEST-NET-1 (RFC 5737): connecting a UDP socket towards it picks the default-route source
#: address without sending a packet
_PROBE_ADDRESS = "192.0.2.1"
_SIOCGIFADDR = 0x8915
_VERIFY_TIMEOUT_SECONDS = 0.5


def _is_usable_ipv4(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return ip.version == 4 and not ip.is_loopback and not ip.is_unspecified and not ip.is_link_local


def is_listenable(address: str, timeout_seconds: float = _VERIFY_TIMEOUT_SECONDS) -> bool:
    """Whether a listening socket bound to ``address`` accepts a connection made to it."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
            server.bind((address, 0))
            server.listen(1)
            port = server.getsockname()[1]
            with socket.create_connection((address, port), timeout=timeout_seconds):
                server.settimeout(timeout_seconds)
                conn, _ = server.accept()
                conn.close()
    except OSError:
        return False
    return True


def _hostname_address() -> str | None:
    name = socket.gethostname()
    try:
        infos = socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)
    except OSError:
        return None
    for info in infos:
        address = str(info[4][0])
        if _is_usable_ipv4(address):
            return address
    return None


def _default_route_address() -> str | None:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((_PROBE_ADDRESS, 9))  # UDP connect sends nothing
            address = str(probe.getsockname()[0])
    except OSError:
        return None
    return address if _is_usable_ipv4(address) else None


def detect_reachable_host() -> str:
    """A non-loopback IPv4 of this machine that workers elsewhere can connect to.

    Tries the address the hostname resolves to, then the default-route interface's address;
    each is checked by listening on it and connecting to it. Falls back to ``127.0.0.1`` with
    a warning.
    """
    candidates = (
        ("hostname", _hostname_address),
        ("default-route interface", _default_route_address),
    )
    for source, find in candidates:
        address = find()
        if address is None:
            continue
        if is_listenable(address):
            logger.info(
                "bellis server address: %s (from the %s); pass run_blockwise(host=...) to "
                "choose another",
                address,
                source,
            )
            return address
        logger.info("bellis: %s address %s is not listenable, skipping it", source, address)
    logger.warning(
        "bellis could not find a non-loopback address for this machine; the server listens on "
        "127.0.0.1, which workers on other machines cannot reach. Pass "
        "run_blockwise(host=...) with an IP address or an interface name such as 'eth0'."
    )
    return "127.0.0.1"


def _interface_address_ioctl(name: str) -> str | None:
    if not sys.platform.startswith("linux"):
        return None
    import fcntl

    encoded = name.encode()[:15]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", encoded))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def _interface_address_ip_command(name: str) -> str | None:
    try:
        out = subprocess.run(
            ["ip", "-4", "-o", "addr", "show", "dev", name],
            capture_output=True,
            text=True,
            timeout=5.0,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in out.stdout.splitlines():
        fields = line.split()
        with contextlib.suppress(ValueError, IndexError):
            return fields[fields.index("inet") + 1].split("/")[0]
    return None


def resolve_interface(name: str) -> str | None:
    """The IPv4 address of the network interface ``name``, or None if there is no such one."""
    try:
        names = {n for _, n in socket.if_nameindex()}
    except OSError:
        names = set()
    if name not in names:
        return None
    address = _interface_address_ioctl(name) or _interface_address_ip_command(name)
    if address is not None:
        logger.info("bellis: interface %s has address %s", name, address)
    else:
        logger.info("bellis: interface %s has no IPv4 address", name)
    return address
