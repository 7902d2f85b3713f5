"""Where a webhook may be sent: no SSRF into the gateway's own networks.

A URL is checked when it is registered AND again before every delivery (DNS can change in
between); the delivery then connects to the address that was checked, so a second lookup
by the HTTP client cannot be pointed elsewhere (DNS rebinding).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
import socket
from urllib.parse import urlsplit

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

# A DNS name: labels of letters, digits and inner hyphens (the whole string).
_HOSTNAME = re.compile(r"(?=.{1,253}\Z)(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)*"
                       r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.?")


class Refused(ValueError):
    """The URL may not be used; the message says why, in a user's words."""


def check_allowlist(settings) -> None:
    """Start-up: ``ISTHMUS_WEBHOOK_ALLOWLIST`` must parse (one line naming the bad entry)."""
    from gateway.identity.errors import ConfigurationError

    try:
        Allowlist.parse(settings.webhook_allowlist)
    except ValueError as exc:
        raise ConfigurationError(f"ISTHMUS_WEBHOOK_ALLOWLIST: {exc}") from None


@dataclasses.dataclass(frozen=True)
class Allowlist:
    """Admin exceptions (``ISTHMUS_WEBHOOK_ALLOWLIST``): CIDRs and host names that may be
    non-public, and the only hosts that may be reached over plain http (for tests)."""

    networks: tuple[Network, ...] = ()
    hosts: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, text: str) -> Allowlist:
        networks: list[Network] = []
        hosts: set[str] = set()
        for item in (p.strip() for p in text.split(",")):
            if not item:
                continue
            try:
                networks.append(ipaddress.ip_network(item, strict=False))
            except ValueError:
                if not _HOSTNAME.fullmatch(item):
                    raise ValueError(f"webhook allowlist: {item!r} is neither a CIDR nor a host name") from None
                hosts.add(item.lower().rstrip("."))
        return cls(tuple(networks), frozenset(hosts))

    def allows_host(self, host: str) -> bool:
        return host in self.hosts

    def allows_address(self, addr: IPAddress) -> bool:
        return any(addr in net for net in self.networks if net.version == addr.version)


@dataclasses.dataclass(frozen=True)
class Target:
    scheme: str
    host: str  # as written (the TLS server name and the Host header)
    port: int
    path: str  # path + query
    address: str  # the checked address to connect to


# IPv6 forms that carry an IPv4 address a translator or tunnel delivers to: the IPv4 address
# is what the connection reaches, so it is judged as that address (issue #27, finding 7).
_NAT64 = ipaddress.ip_network("64:ff9b::/96")  # RFC 6052 well-known prefix
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")  # RFC 8215 local-use prefix
_SIX_TO_FOUR = ipaddress.ip_network("2002::/16")  # RFC 3056
_TEREDO = ipaddress.ip_network("2001::/32")  # RFC 4380
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")  # RFC 4291, deprecated (::a.b.c.d)


def embedded_ipv4(addr: IPAddress) -> list[tuple[str, ipaddress.IPv4Address]]:
    """The IPv4 addresses an IPv6 address embeds or maps to, each with its form's name."""
    if not isinstance(addr, ipaddress.IPv6Address):
        return []
    low32 = ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
    if addr.ipv4_mapped is not None:
        return [("IPv4-mapped", addr.ipv4_mapped)]
    if addr in _IPV4_COMPATIBLE and int(addr) > 1:  # not :: and ::1, which are what they say
        return [("IPv4-compatible", low32)]
    if addr in _NAT64 or addr in _NAT64_LOCAL:
        return [("NAT64", low32)]
    if addr in _SIX_TO_FOUR:
        return [("6to4", ipaddress.IPv4Address((int(addr) >> 80) & 0xFFFFFFFF))]
    if addr in _TEREDO:  # the server in bits 32-63, the client obfuscated (XOR) in the last 32
        return [("Teredo server", ipaddress.IPv4Address((int(addr) >> 64) & 0xFFFFFFFF)),
                ("Teredo client", ipaddress.IPv4Address(int(low32) ^ 0xFFFFFFFF))]
    return []


def _own_reason(addr: IPAddress) -> str | None:
    for attr, words in (("is_unspecified", "unspecified"), ("is_loopback", "loopback"),
                        ("is_link_local", "link-local"), ("is_multicast", "multicast"),
                        ("is_private", "private")):
        if getattr(addr, attr):
            return words
    if isinstance(addr, ipaddress.IPv6Address) and addr in ipaddress.ip_network("fc00::/7"):
        return "unique-local"
    if not addr.is_global:
        return "not globally routable"
    return None


def forbidden_reason(addr: IPAddress) -> str | None:
    """Why an address is not a public one (None when it is).

    An IPv6 address that embeds an IPv4 address is refused when that IPv4 address would be,
    and also when the IPv6 address itself is not public.
    """
    for form, v4 in embedded_ipv4(addr):
        why = _own_reason(v4)
        if why:
            return f"{why} (the {form} form of {v4})"
    return _own_reason(addr)


def parse_url(url: str) -> tuple[str, str, int, str]:
    try:
        parts = urlsplit(url)
        hostname = parts.hostname
    except ValueError:  # e.g. an unbalanced "[" in the host
        raise Refused("is not a valid URL") from None
    if any(c.isspace() or ord(c) < 32 for c in url):
        raise Refused("must not contain spaces or control characters")
    scheme = parts.scheme.lower()
    if scheme not in ("https", "http"):
        raise Refused("must be an https:// URL")
    if parts.username or parts.password:
        raise Refused("must not carry credentials (user:password@)")
    host = (hostname or "").lower().rstrip(".")
    if not host:
        raise Refused("has no host")
    try:
        port = parts.port or (443 if scheme == "https" else 80)
    except ValueError:
        raise Refused("has an invalid port") from None
    if parts.fragment:
        raise Refused("must not have a #fragment")
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return scheme, host, port, path


def resolve(url: str, allow: Allowlist) -> Target:
    """Check ``url`` and pick the address to connect to.

    Raises:
        Refused: not https (unless its host is allow-listed), unresolvable, or some address
            it resolves to is non-public and not allow-listed.
    """
    scheme, host, port, path = parse_url(url)
    try:
        literal: IPAddress | None = ipaddress.ip_address(host)
    except ValueError:
        literal = None
    if literal is None and not _HOSTNAME.fullmatch(host):
        raise Refused("has an invalid host name")
    if scheme == "http" and not (allow.allows_host(host) or (literal is not None and allow.allows_address(literal))):
        raise Refused("must be an https:// URL (http only for hosts an admin allow-listed)")
    if literal is not None:
        addresses = [literal]
    else:
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError) as exc:
            raise Refused(f"host {host!r} does not resolve") from exc
        addresses = list(dict.fromkeys(ipaddress.ip_address(i[4][0].split("%")[0]) for i in infos))
        if not addresses:
            raise Refused(f"host {host!r} does not resolve")
    # Every address must pass: a name with one public and one private address would
    # otherwise reach the private one whenever the resolver's order changes.
    host_allowed = allow.allows_host(host)
    for addr in addresses:
        why = forbidden_reason(addr)
        if why and not (host_allowed or allow.allows_address(addr)):
            raise Refused(f"host {host!r} resolves to {addr}, which is {why}; an admin may allow it "
                          "with ISTHMUS_WEBHOOK_ALLOWLIST")
    return Target(scheme=scheme, host=host, port=port, path=path, address=str(addresses[0]))
