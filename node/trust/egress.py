"""Egress policy: which addresses the node itself may contact (proxy deliveries, callbacks, probes).

An address is judged in this order:

1. **Never allowed**, whatever the region says: unspecified (``0.0.0.0/8``, ``::``), link-local
   (``169.254.0.0/16``, ``fe80::/10``), cloud metadata addresses (``169.254.169.254``,
   ``fd00:ec2::254``, ``100.100.100.200`` …) and names (``metadata.google.internal`` …),
   multicast, broadcast and the reserved ``240.0.0.0/4``. IPv6 forms that carry an IPv4 address
   (``::ffff:a.b.c.d``, ``::a.b.c.d``, NAT64 ``64:ff9b::/96``, 6to4 ``2002::/16``) are judged by the
   IPv4 address they carry, so ``::ffff:127.0.0.1`` follows loopback's rule.
2. The region's **deny** list (CIDRs or group names).
3. **Loopback** (``127.0.0.0/8``, ``::1``) and **private** ranges (``10/8``, ``172.16/12``,
   ``192.168/16``, ``100.64/10``, ``fc00::/7``, ``fec0::/10``): only if the **allow** list covers them.
4. Anything else (public) is allowed.

URLs the node dials must be ``http``/``https`` and carry no userinfo (``user:pass@``: the node
never turns it into an Authorization header). A topology sets the policy per region::

    policy = { egress = { allow = ["loopback"], deny = ["10.9.0.0/16"] } }

Two places enforce it. :meth:`EgressPolicy.check_url` and :meth:`EgressPolicy.check_registration`
are static (scheme, userinfo, literal IPs in any spelling, metadata and ``localhost`` names; no
DNS) — for registration. :class:`EgressConnector` is the aiohttp connector of every outbound
session: it checks the addresses a name resolves to, and every socket address just before it is
dialled, so a name that resolves — or re-resolves (DNS rebinding) — to a denied address is never
connected.
"""

from __future__ import annotations

import errno
import functools
import ipaddress
import re
import socket
import ssl
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator
from yarl import URL

from ..core import ValidationFailed

if TYPE_CHECKING:
    from ..core.models import Registration

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

NODE_SCHEMES = ("http", "https")
LOOPBACK = "loopback"
PRIVATE = "private"
_JUDGED_URLS = 16_384  # URLs whose verdict is remembered, per policy and schemes

_net = ipaddress.ip_network
GROUPS: dict[str, tuple[IPNetwork, ...]] = {
    LOOPBACK: (_net("127.0.0.0/8"), _net("::1/128")),
    PRIVATE: (_net("10.0.0.0/8"), _net("172.16.0.0/12"), _net("192.168.0.0/16"), _net("100.64.0.0/10"),
              _net("fc00::/7"), _net("fec0::/10")),  # fec0::/10: deprecated site-local, still routed inside sites
}
# (rule, how the message describes it, networks); the first match names the rule.
_NEVER: tuple[tuple[str, str, tuple[IPNetwork, ...]], ...] = (
    ("unspecified", "unspecified (0.0.0.0/8 and :: reach this host)", (_net("0.0.0.0/8"), _net("::/128"))),
    ("link-local", "link-local", (_net("169.254.0.0/16"), _net("fe80::/10"))),
    ("multicast", "multicast", (_net("224.0.0.0/4"), _net("ff00::/8"))),
    ("broadcast", "the broadcast address", (_net("255.255.255.255/32"),)),
    ("reserved", "reserved (240.0.0.0/4)", (_net("240.0.0.0/4"),)),
)
METADATA_ADDRESSES: frozenset[IPAddress] = frozenset(ipaddress.ip_address(a) for a in (
    "169.254.169.254",   # AWS, GCP, Azure, OpenStack, DigitalOcean, Oracle … instance metadata
    "169.254.170.2",     # AWS ECS task metadata and credentials
    "fd00:ec2::254",     # AWS instance metadata over IPv6 (inside fc00::/7, so "private" must not open it)
    "100.100.100.200",   # Alibaba Cloud metadata (inside 100.64.0.0/10)
    "192.0.0.192",       # Oracle Cloud Classic metadata
))
METADATA_NAMES: frozenset[str] = frozenset((
    "metadata", "metadata.google.internal", "metadata.goog", "metadata.azure.com",
    "instance-data", "instance-data.ec2.internal", "metadata.tencentyun.com",
))
_LOOPBACK_NAMES = frozenset(("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"))
_LOOPBACK_ADDRESSES = (ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1"))
_NAT64 = _net("64:ff9b::/96")
_COMPATIBLE = _net("::/96")
_HOST_NAME = re.compile(r"^[a-z0-9_]([a-z0-9_-]{0,62})(\.[a-z0-9_]([a-z0-9_-]{0,62}))*$")


class EgressDenied(ValidationFailed):
    """The region's egress policy forbids contacting this address; the message names it and the rule.

    ``address`` is the host, address or URL part refused; ``rule`` a short name of the rule
    (``loopback``, ``private``, ``link-local``, ``metadata``, ``deny-list``, ``userinfo``, ``scheme`` …).
    It is a 422 ``egress_denied``; ``field`` names the registration field when one is known.
    """

    code = "egress_denied"

    def __init__(self, message: str, *, address: str, rule: str, field: str | None = None) -> None:
        super().__init__(message, field=field, details={"address": address, "rule": rule})
        self.address = address
        self.rule = rule

    def for_field(self, field: str) -> EgressDenied:
        """The same denial, naming the registration field it came from."""
        return EgressDenied(f"{field}: {self.message}", address=self.address, rule=self.rule, field=field)


class EgressRefused(OSError):
    """A connection attempt refused before any packet was sent; carries the :class:`EgressDenied`.

    An OSError so that aiohttp and aiohappyeyeballs treat it as a failed connect (and wrap it in
    ``ClientConnectorError``) instead of crashing; :func:`egress_denial` digs it out again.
    """

    def __init__(self, denial: EgressDenied) -> None:
        super().__init__(errno.EACCES, denial.message)
        self.denial = denial


def egress_denial(exc: BaseException) -> EgressDenied | None:
    """The egress denial behind an aiohttp error (its cause chain or ``os_error``), or None."""
    seen: set[int] = set()
    pending: list[BaseException | None] = [exc]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, EgressDenied):
            return current
        if isinstance(current, EgressRefused):
            return current.denial
        pending += [current.__cause__, current.__context__, getattr(current, "os_error", None)]
    return None


class EgressPolicy(BaseModel):
    """What a region's node may contact; ``EgressPolicy()`` allows public addresses only.

    ``allow`` opens loopback/private ranges: group names (``"loopback"``, ``"private"``) or CIDRs
    inside them (``"10.1.0.0/16"``). ``deny`` closes more: CIDRs or group names. Deny wins over
    allow; the fixed rules (link-local, metadata …) win over both. Entries are validated when the
    policy is built: a CIDR with host bits set, a public range in ``allow`` (public is allowed
    already) or an always-denied range in ``allow`` is an error.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    allow: tuple[str, ...] = Field(default=(), max_length=256,
                                   description='Loopback/private ranges the node may contact: "loopback", '
                                               '"private" or CIDRs like "10.1.0.0/16".')
    deny: tuple[str, ...] = Field(default=(), max_length=256,
                                  description="CIDRs (or group names) the node must never contact.")
    _allowed: tuple[IPNetwork, ...] = PrivateAttr(default=())
    _denied: tuple[IPNetwork, ...] = PrivateAttr(default=())

    @field_validator("allow")
    @classmethod
    def _allow(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for entry in value:
            for network in _parse_entry(entry):
                _check_allowable(entry, network)
        return value

    @field_validator("deny")
    @classmethod
    def _deny(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for entry in value:
            _parse_entry(entry)
        return value

    def model_post_init(self, context: Any) -> None:
        self._allowed = tuple(network for entry in self.allow for network in _parse_entry(entry))
        self._denied = tuple(network for entry in self.deny for network in _parse_entry(entry))

    # -- judging addresses -------------------------------------------------------------------

    def check_ip(self, address: str | IPAddress) -> None:
        """Raise :class:`EgressDenied` unless the node may connect to this IP address."""
        denial = self.ip_denial(address)
        if denial is not None:
            raise denial

    def ip_denial(self, address: str | IPAddress) -> EgressDenied | None:
        """Why the node may not connect to this IP address (parsed strictly), or None if it may."""
        shown = str(address)
        try:
            ip = address if not isinstance(address, str) else ipaddress.ip_address(address)
        except ValueError:
            return EgressDenied(f"{shown!r} is not an IP address", address=shown, rule="invalid-address")
        if isinstance(ip, ipaddress.IPv6Address) and ip.scope_id:
            ip = ipaddress.IPv6Address(str(ip).split("%", 1)[0])
        carried = _carried_ipv4(ip)
        if carried is not None:
            shown = f"{shown} (which carries {carried})"
            ip = carried
        if ip in METADATA_ADDRESSES:
            return EgressDenied(f"{shown} is a cloud metadata address; the region's egress policy never allows it",
                                address=str(address), rule="metadata")
        for rule, description, networks in _NEVER:
            if any(ip in network for network in networks):
                return EgressDenied(f"{shown} is {description}; the region's egress policy never allows it",
                                    address=str(address), rule=rule)
        for network in self._denied:
            if ip in network:
                return EgressDenied(f"{shown} is in {network}, which the region's egress policy denies "
                                    "(policy.egress.deny)", address=str(address), rule="deny-list")
        group = _group_of(ip)
        if group is not None and not self._allows(ip):
            return EgressDenied(f"{shown} is {group}; the region's egress policy does not allow {group} addresses "
                                f'(add "{group}" or a range covering it to the region\'s policy.egress.allow, or run '
                                f'agent-reach node --egress-allow {group})',
                                address=str(address), rule=group)
        return None

    def _allows(self, ip: IPAddress) -> bool:
        return any(ip in network for network in self._allowed)

    def check_host(self, host: str) -> None:
        """Raise :class:`EgressDenied` for a host (name or literal IP) that is refused without DNS.

        Literal IPs get the full rule; non-canonical IPv4 spellings (``0x7f000001``,
        ``2130706433``, ``0177.0.0.1``, ``127.1``), which libc would quietly turn into an address,
        are refused outright; metadata names are never allowed; ``localhost`` and ``*.localhost``
        follow loopback's rule. Other names pass: their addresses are checked at connect time.
        """
        name = host.strip("[]").lower()
        if name.endswith(".") and not name.endswith(".."):
            name = name[:-1]
        try:
            ip = ipaddress.ip_address(name)
        except ValueError:
            pass
        else:
            self.check_ip(ip)
            return
        if ":" in name and "%" in name:  # an IPv6 literal with a zone: only link-local addresses have zones
            self.check_ip(name)
            return
        if not _HOST_NAME.match(name):
            raise EgressDenied(f"{host!r} is not a valid host name (letters, digits, '-', '_' and dots)",
                               address=host, rule="invalid-host")
        canonical = _legacy_ipv4(name)
        if canonical is not None:
            raise EgressDenied(f"{host} is a non-canonical spelling of the IPv4 address {canonical}; "
                               f"write it as {canonical}", address=host, rule="non-canonical-ipv4")
        if _is_metadata_name(name):
            raise EgressDenied(f"{host} is a cloud metadata name; the region's egress policy never allows it",
                               address=host, rule="metadata")
        # RFC 6761: these names always mean this host, so judge them as loopback without DNS.
        loopback_name = name in _LOOPBACK_NAMES or name.endswith(".localhost")
        if loopback_name and not any(self._allows(ip) for ip in _LOOPBACK_ADDRESSES):
            raise EgressDenied(f"{host} is a loopback name; the region's egress policy does not allow loopback "
                               f'addresses (add "{LOOPBACK}" to the region\'s policy.egress.allow, or run '
                               f'agent-reach node --egress-allow {LOOPBACK})', address=host, rule=LOOPBACK)

    def check_url(self, url: str, *, schemes: Iterable[str] | None = NODE_SCHEMES) -> None:
        """Raise :class:`EgressDenied` if ``url`` may not be contacted, judged without DNS.

        ``schemes``: the schemes allowed (default http and https, for URLs the node dials);
        None allows any scheme (endpoints that only callers dial). Userinfo is always refused.
        """
        try:
            parsed = URL(url)
            split = urlsplit(url)
            other_host = split.hostname
        except (ValueError, TypeError) as exc:
            raise EgressDenied(f"{url!r} is not a valid URL: {exc}", address=url, rule="invalid-url") from exc
        if schemes is not None:
            allowed = tuple(schemes)
            if parsed.scheme not in allowed:
                raise EgressDenied(f"the node contacts only {' and '.join(allowed)} URLs, not "
                                   f"{parsed.scheme or 'scheme-less'} ones ({url})", address=url, rule="scheme")
        # Both parsers: urllib (the models' validators) and yarl (what aiohttp dials) must agree
        # that there is no userinfo, or a crafted URL could mean one thing to each.
        if parsed.raw_user is not None or parsed.raw_password is not None or "@" in split.netloc:
            raise EgressDenied("URLs with userinfo (user:password@) are refused: the node never sends credentials "
                               "from a URL; drop the userinfo", address=_without_userinfo(parsed), rule="userinfo")
        host = parsed.raw_host
        if not host:
            raise EgressDenied(f"{url!r} has no host", address=url, rule="invalid-url")
        # An ASCII host that urllib reads differently from yarl is judged too (callers may dial
        # with either); a non-ASCII one is the same name yarl already judged in punycode.
        for name in (host, other_host) if other_host and other_host.isascii() and other_host != host.lower() else (host,):
            denied = _host_verdict(self, name)
            if denied is not None:
                raise EgressDenied(denied.message, address=denied.address, rule=denied.rule)  # a fresh one

    def check_registration(self, registration: Registration) -> EgressDenied | None:
        """The first egress violation of a registration (with ``field`` set), or None.

        Checks every endpoint (any scheme: callers dial those, but the host rules apply), the
        ``callback_endpoint`` and the probe URLs (http/https only: the node dials them). The
        result is a 422 ``egress_denied`` :class:`~node.core.errors.NodeError`; raise it as it is.
        """
        candidates: list[tuple[str, str, tuple[str, ...] | None]] = [
            (f"endpoints.{name}", url, None) for name, url in registration.endpoints.items()]
        if registration.callback_endpoint is not None:
            candidates.append(("callback_endpoint", registration.callback_endpoint, NODE_SCHEMES))
        for name in ("liveness_probe", "readiness_probe"):
            probe = getattr(registration, name)
            if probe is not None:
                candidates.append((f"{name}.url", probe.url, NODE_SCHEMES))
        for field, url, schemes in candidates:
            denied = _judged(self, url, schemes)
            if denied is not None:
                return denied.for_field(field)
        return None


DEFAULT_EGRESS_POLICY = EgressPolicy()


@functools.lru_cache(maxsize=_JUDGED_URLS)
def _host_verdict(policy: EgressPolicy, host: str) -> EgressDenied | None:
    """``policy.check_host`` as a value, remembered: many agents share a host (distinct ports)."""
    try:
        policy.check_host(host)
    except EgressDenied as denied:
        return denied
    return None


@functools.lru_cache(maxsize=_JUDGED_URLS)
def _judged(policy: EgressPolicy, url: str, schemes: tuple[str, ...] | None) -> EgressDenied | None:
    """``policy.check_url`` as a value, remembered: agents register the same URLs again and again
    (every restart, every re-registration), and two URL parsers per URL show on that path."""
    try:
        policy.check_url(url, schemes=schemes)
    except EgressDenied as denied:
        return denied
    return None


# -- enforcement at connect time -------------------------------------------------------------


class _CheckingResolver(AbstractResolver):
    """Resolves with ``inner``, then keeps only the addresses the policy allows."""

    def __init__(self, policy: EgressPolicy, inner: AbstractResolver) -> None:
        self.policy = policy
        self.inner = inner

    async def resolve(self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
                      ) -> list[ResolveResult]:
        try:
            self.policy.check_host(host)
        except EgressDenied as denied:
            raise EgressRefused(denied) from denied
        results = await self.inner.resolve(host, port, family)
        if not results:  # aiohttp's connector cannot handle an empty answer (it asserts)
            raise OSError(errno.ENOENT, f"{host} resolves to no address")
        # Denied addresses are dropped, not fatal: a name with one stray private AAAA record still
        # works over its public address. Only the addresses kept here are ever dialled.
        verdicts = [(result["host"], self.policy.ip_denial(result["host"])) for result in results]
        allowed = [result for result, (_, denial) in zip(results, verdicts, strict=True) if denial is None]
        if not allowed:
            address, denial = next((address, denial) for address, denial in verdicts if denial is not None)
            raise EgressRefused(EgressDenied(f"{host} resolves to {address}: {denial.message}",
                                             address=f"{host} ({address})", rule=denial.rule))
        return allowed

    async def close(self) -> None:
        await self.inner.close()


def _guarded_socket(policy: EgressPolicy) -> Callable[[tuple[Any, ...]], socket.socket]:
    def socket_factory(addr_info: tuple[Any, ...]) -> socket.socket:
        # The last word: this is the address the socket is about to be connected to, whatever
        # the URL said and whatever a resolver (or its cache) answered.
        family, type_, proto, _, sockaddr = addr_info
        denial = policy.ip_denial(str(sockaddr[0]))
        if denial is not None:
            raise EgressRefused(denial)
        return socket.socket(family=family, type=type_, proto=proto)

    return socket_factory


class EgressConnector(aiohttp.TCPConnector):
    """A ``TCPConnector`` that connects only to addresses ``policy`` allows.

    Names go through a resolver that drops denied addresses (all denied: the connect fails with
    :class:`EgressRefused`); every socket address is checked again in aiohttp's
    ``socket_factory`` hook right before ``connect``, which also covers IP-literal hosts (aiohttp
    does not pass those to the resolver). A refusal surfaces as ``aiohttp.ClientConnectorError``;
    :func:`egress_denial` recovers the reason. Create it inside a running event loop.

    ``resolver``: the DNS resolver to check (default aiohttp's); it is closed with the connector.
    ``ssl_context``: what https targets are checked against (``ClientTlsSettings.client_ssl_context()``:
    the node's ``ca_file`` and client certificate; default the system's store).
    """

    def __init__(self, policy: EgressPolicy, *, resolver: AbstractResolver | None = None, limit: int = 100,
                 limit_per_host: int = 0, ssl_context: ssl.SSLContext | bool = True) -> None:
        self._egress_resolver = _CheckingResolver(policy, resolver or aiohttp.DefaultResolver())
        super().__init__(resolver=self._egress_resolver, socket_factory=_guarded_socket(policy), limit=limit,
                         limit_per_host=limit_per_host, ssl=ssl_context)
        self.policy = policy

    async def close(self, *, abort_ssl: bool = False) -> None:
        try:
            await super().close(abort_ssl=abort_ssl)
        finally:
            await self._egress_resolver.close()  # passed in, so TCPConnector does not close it


def egress_session(policy: EgressPolicy, *, ssl_context: ssl.SSLContext | bool = True,
                   **session_options: Any) -> aiohttp.ClientSession:
    """A ClientSession for outbound calls: :class:`EgressConnector`, no cookie jar, no proxy from env.

    Cookies are dropped so one target cannot plant cookies the node would replay to another.
    ``ssl_context``: as :class:`EgressConnector`'s.
    """
    return aiohttp.ClientSession(connector=EgressConnector(policy, ssl_context=ssl_context),
                                 cookie_jar=aiohttp.DummyCookieJar(), trust_env=False, **session_options)


# -- helpers ---------------------------------------------------------------------------------


def _parse_entry(entry: str) -> tuple[IPNetwork, ...]:
    if entry in GROUPS:
        return GROUPS[entry]
    try:
        return (ipaddress.ip_network(entry, strict=True),)
    except ValueError as exc:
        try:
            loose = ipaddress.ip_network(entry, strict=False)
        except ValueError:
            raise ValueError(f"{entry!r} is neither a group ({', '.join(GROUPS)}) nor a CIDR like "
                             f"'10.1.0.0/16'") from exc
        raise ValueError(f"{entry!r} has host bits set; did you mean {loose}?") from exc


def _check_allowable(entry: str, network: IPNetwork) -> None:
    for _rule, description, networks in _NEVER:
        if any(_within(network, never) for never in networks):
            raise ValueError(f"{entry!r} is {description}, which the egress policy never allows")
    if not any(network.version == group.version and network.overlaps(group)
               for groups in GROUPS.values() for group in groups):
        raise ValueError(f"{entry!r} is public: public addresses are allowed unless denied, so allow lists "
                         "only loopback and private ranges")


def _within(network: IPNetwork, outer: IPNetwork) -> bool:
    return network.version == outer.version and network.subnet_of(outer)  # type: ignore[arg-type]


def _is_metadata_name(name: str) -> bool:
    return name in METADATA_NAMES or any(name.endswith("." + metadata) for metadata in METADATA_NAMES
                                         if "." in metadata)


def _group_of(ip: IPAddress) -> str | None:
    for group, networks in GROUPS.items():
        if any(ip in network for network in networks):
            return group
    return None


def _carried_ipv4(ip: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address stands for (mapped, compatible, NAT64, 6to4), if any."""
    if not isinstance(ip, ipaddress.IPv6Address):
        return None
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip in _NAT64 or (ip in _COMPATIBLE and int(ip) > 1):  # :: and ::1 are IPv6's own
        return ipaddress.IPv4Address(int(ip) & 0xFFFF_FFFF)
    return None


def _legacy_ipv4(name: str) -> str | None:
    """The dotted-quad that libc reads a numeric name as (``127.1`` → ``127.0.0.1``), or None."""
    try:
        return socket.inet_ntoa(socket.inet_aton(name))
    except OSError:
        return None


def _without_userinfo(url: URL) -> str:
    return str(url.with_user(None)) if url.raw_host else "the URL"


__all__ = ["DEFAULT_EGRESS_POLICY", "GROUPS", "LOOPBACK", "METADATA_ADDRESSES", "METADATA_NAMES", "NODE_SCHEMES",
           "PRIVATE", "EgressConnector", "EgressDenied", "EgressPolicy", "EgressRefused", "egress_denial",
           "egress_session"]
