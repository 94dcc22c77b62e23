"""The address classifier behind webhooks: every way a URL can spell an internal address is
refused, public addresses pass, and the operator's allow-list lets its own receivers in. The
literal addresses need no network: getaddrinfo reads them (the short, decimal, hex and octal
IPv4 forms too) without asking DNS."""

from ipaddress import ip_address, ip_network

import pytest

from common.addresses import (
    DOES_NOT_RESOLVE,
    NOT_PUBLIC,
    Refused,
    Target,
    allowed,
    reachable,
)

INTERNAL = [
    "http://127.0.0.1/", "http://127.1/", "http://2130706433/", "http://0x7f000001/",
    "http://0177.0.0.1/", "http://127.0.0.1:8080/x", "http://0.0.0.0/", "http://[::1]/",
    "http://[::ffff:127.0.0.1]/", "http://[::ffff:7f00:1]/", "http://[::127.0.0.1]/",
    "http://localhost/", "http://LOCALHOST/", "http://localhost:8000/",
    "http://169.254.169.254/latest/meta-data/", "http://10.0.0.1/", "http://10.255.255.255/",
    "http://172.16.0.1/", "http://172.31.255.254/", "http://192.168.1.1/",
    "http://100.64.0.1/", "http://224.0.0.1/", "http://239.255.255.250/",
    "http://255.255.255.255/", "http://240.0.0.1/", "http://192.0.2.1/",
    "http://[fc00::1]/", "http://[fd12:3456::1]/", "http://[fe80::1]/", "http://[::]/",
    "http://[ff02::1]/", "http://[fec0::1]/", "http://[2001:db8::1]/",
    "http://[2002:7f00:1::1]/",  # 6to4 carrying 127.0.0.1
    "http://[2002:a00:1::1]/",  # 6to4 carrying 10.0.0.1
    "http://[2001:0:4136:e378:8000:63bf:80ff:fffe]/",  # Teredo carrying 127.0.0.1
    "http://[64:ff9b::a9fe:a9fe]/",  # NAT64 carrying 169.254.169.254
    "https://127.0.0.1/", "HTTP://127.0.0.1/",
]


@pytest.mark.parametrize("url", INTERNAL)
def test_every_spelling_of_an_internal_address_is_refused(url):
    with pytest.raises(Refused, match=f"^{NOT_PUBLIC}$"):
        reachable(url)


@pytest.mark.parametrize("url", ["http://localhost./", "http://localhost.localdomain./",
                                 "http://no-such-host.invalid/"])
def test_a_name_that_resolves_to_nothing_or_to_loopback_is_refused(url):
    """`localhost.` (a trailing dot: the name is absolute) is not in every hosts file; where
    it resolves, it is loopback."""
    with pytest.raises(Refused, match=f"^({NOT_PUBLIC}|{DOES_NOT_RESOLVE})$"):
        reachable(url)


@pytest.mark.parametrize(("url", "reason"), [
    ("file:///etc/passwd", "use an http or https URL"),
    ("gopher://1.1.1.1:70/_x", "use an http or https URL"),
    ("ftp://1.1.1.1/", "use an http or https URL"),
    ("//1.1.1.1/", "use an http or https URL"),
    ("http://evil@127.0.0.1/", "no user name or password in the URL"),
    ("http://user:pw@1.1.1.1/", "no user name or password in the URL"),
    ("http://1.1.1.1\\@127.0.0.1/", "no user name or password in the URL"),
    ("http:///path", "no host in the URL"),
    ("http://1.1.1.1:99999/", "not a valid URL"),
    ("http://1.1.1.1:port/", "not a valid URL"),
    ("http://[::1/", "not a valid URL"),
])
def test_what_is_not_an_http_url_to_a_host_is_refused_naming_why(url, reason):
    with pytest.raises(Refused, match=f"^{reason}$"):
        reachable(url)


def test_a_public_address_passes_with_where_to_connect_and_what_to_send():
    target = reachable("http://1.1.1.1:8080/hook?x=1#frag")
    assert target.addresses == (ip_address("1.1.1.1"),)
    assert target.url_for(target.addresses[0]) == "http://1.1.1.1:8080/hook?x=1"
    assert (target.host_header, target.server_name) == ("1.1.1.1:8080", None)
    v6 = reachable("https://[2606:4700:4700::1111]")
    assert v6.url_for(v6.addresses[0]) == "https://[2606:4700:4700::1111]:443/"
    assert v6.host_header == "[2606:4700:4700::1111]"


def test_the_allow_list_lets_the_operators_own_receivers_in(settings):
    settings.RINGSIDE_WEBHOOK_ALLOW = (ip_network("127.0.0.0/8"), ip_network("10.1.0.0/16"))
    for url in ["http://127.0.0.1:9000/", "http://127.1/", "http://[::ffff:127.0.0.1]/",
                "http://10.1.2.3/"]:
        assert reachable(url).addresses
    for url in ["http://10.2.0.1/", "http://[::1]/", "http://169.254.169.254/"]:
        with pytest.raises(Refused):
            reachable(url)


def test_an_embedded_public_ipv4_address_passes_and_an_allowed_one_is_allowed():
    assert allowed(ip_address("2002:101:101::1"), allow=())  # 6to4 of 1.1.1.1
    assert not allowed(ip_address("::ffff:10.0.0.1"), allow=())
    assert allowed(ip_address("::ffff:10.0.0.1"), allow=(ip_network("10.0.0.0/8"),))
    assert not allowed(ip_address("2002:a00:1::1"), allow=(ip_network("10.0.0.0/8"),))


def test_a_host_name_travels_in_the_host_header_and_tls():
    target = Target("https", "hooks.example.com", 443, "/x", (ip_address("1.1.1.1"),))
    assert target.url_for(ip_address("1.1.1.1")) == "https://1.1.1.1:443/x"
    assert (target.host_header, target.server_name) == ("hooks.example.com",
                                                        "hooks.example.com")
