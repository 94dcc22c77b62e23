"""Whether the server may send a request to a URL a user gave it (webhooks: no SSRF).

A URL may be reached when it is http(s), names no user or password, and every address its host
resolves to is public: not loopback, private, link-local, multicast, unspecified, reserved or
shared (CGNAT), and no IPv4 address embedded in an IPv6 one (IPv4-mapped, 6to4, Teredo,
NAT64) is either. The host is resolved with getaddrinfo, which also reads the spellings of an
IPv4 address that are not dotted quads (`127.1`, `2130706433`, `0x7f000001`, `0177.0.0.1`), so
every form reduces to the addresses checked. An operator's own receivers may sit inside the
CIDRs of RINGSIDE_WEBHOOK_ALLOW. `reachable` answers a `Target` holding the checked addresses:
the caller connects to one of them, never resolving the name again (a second answer from DNS
could be another address: rebinding).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.conf import settings

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

DEFAULT_PORTS = {"http": 80, "https": 443}
NOT_PUBLIC = "not a public address"
DOES_NOT_RESOLVE = "does not resolve"
# not public, yet public to some versions of `ipaddress`: shared address space (CGNAT) and the
# local-use NAT64 prefix, whose embedding of an IPv4 address is the operator's choice
NON_PUBLIC = (ipaddress.ip_network("100.64.0.0/10"), ipaddress.ip_network("64:ff9b:1::/48"))
NAT64 = ipaddress.ip_network("64:ff9b::/96")


class Refused(ValueError):
    """A URL the server will not reach; its message is safe to show the URL's author: it says
    no more than "not a public address" about what the host resolved to."""


class Unresolved(Refused):
    """A host name that resolves to nothing (now: at delivery this may pass)."""


@dataclass(frozen=True)
class Target:
    """A checked URL: where to connect (`addresses`, every one allowed) and what to send."""

    scheme: str
    host: str  # as the URL names it, for the Host header and TLS (SNI, the certificate)
    port: int
    path: str  # with the query
    addresses: tuple[Address, ...]

    def url_for(self, address: Address) -> str:
        literal = f"[{address}]" if address.version == 6 else str(address)
        return f"{self.scheme}://{literal}:{self.port}{self.path}"

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == DEFAULT_PORTS[self.scheme] else f"{host}:{self.port}"

    @property
    def server_name(self) -> str | None:
        """The name TLS sends and verifies the certificate for; None for an address literal
        (SNI carries no addresses; the certificate is then checked for the address)."""
        try:
            ipaddress.ip_address(self.host)
        except ValueError:
            return self.host
        return None


def reachable(url: str) -> Target:
    """The checked target of `url`; raises Refused (Unresolved for a name that resolves to
    nothing) naming why not."""
    scheme, host, port, path = _parts(url)
    addresses = resolve(host, port)
    if not all(allowed(address) for address in addresses):
        raise Refused(NOT_PUBLIC)
    return Target(scheme, host, port, path, addresses)


def _parts(url: str) -> tuple[str, str, int, str]:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as e:  # an unclosed [ or a port that is no number
        raise Refused("not a valid URL") from e
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise Refused("use an http or https URL")
    if "@" in parts.netloc:  # parsers disagree on where a user part ends: none at all
        raise Refused("no user name or password in the URL")
    if not parts.hostname:
        raise Refused("no host in the URL")
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return scheme, parts.hostname, port or DEFAULT_PORTS[scheme], path


def resolve(host: str, port: int) -> tuple[Address, ...]:
    """Every address `host` resolves to, in the resolver's order, each once."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError, ValueError) as e:  # no such name; a name IDNA cannot encode
        raise Unresolved(DOES_NOT_RESOLVE) from e
    found = [ipaddress.ip_address(info[4][0]) for info in infos]
    return tuple(dict.fromkeys(found))


def allowed(address: Address, allow: Iterable[Network] | None = None) -> bool:
    """Whether the server may connect to `address`: it (or the IPv4 address it maps) is in
    the operator's allow-list (RINGSIDE_WEBHOOK_ALLOW unless `allow` is given), or it and every
    IPv4 address embedded in it are public."""
    allow = settings.RINGSIDE_WEBHOOK_ALLOW if allow is None else allow
    mapped = address.ipv4_mapped if address.version == 6 else None
    if any(form in network for network in allow for form in (address, mapped) if form):
        return True
    return all(_public(form) for form in (address, *_embedded(address)))


def _embedded(address: Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address carries, where a packet to it may end up."""
    if address.version == 4:
        return []
    found = [address.ipv4_mapped, address.sixtofour, *(address.teredo or ())]
    if address in NAT64:
        found.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
    return [form for form in found if form is not None]


def _public(address: Address) -> bool:
    # is_global alone lets multicast through, and differs between Python versions at the edges
    return address.is_global and not (
        address.is_private or address.is_loopback or address.is_link_local
        or address.is_multicast or address.is_reserved or address.is_unspecified
        or getattr(address, "is_site_local", False)
        or any(address in network for network in NON_PUBLIC))
