"""One redaction rule for both kinds of URL warmenv prints: a Redis server's and a bundle's."""

from __future__ import annotations

import pytest

from warmenv import WarmenvError
from warmenv._url import check_redis_url, is_http_url, redact, redact_in, redact_urls_in
from warmenv.remote import RemoteError

SECRET = "s3cret-Pa55word"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (f"http://reader:{SECRET}@127.0.0.1:8080/a.bundle", "http://***@127.0.0.1:8080/a.bundle"),
        (f"redis://fleet:{SECRET}@cache:6379/0", "redis://***@cache:6379/0"),
    ],
)
def test_a_user_and_password_are_both_hidden(url: str, shown: str) -> None:
    assert redact(url) == shown


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (f"redis://:{SECRET}@127.0.0.1:6390/0", "redis://:***@127.0.0.1:6390/0"),
        (f"https://:{SECRET}@cdn.example/a.bundle", "https://:***@cdn.example/a.bundle"),
    ],
)
def test_a_password_alone_is_hidden_and_shown_as_one(url: str, shown: str) -> None:
    assert redact(url) == shown


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (f"https://{SECRET}@github.example/a.bundle", "https://***@github.example/a.bundle"),
        (f"rediss://{SECRET}@cache/0", "rediss://***@cache/0"),
    ],
)
def test_a_user_name_alone_is_hidden_as_it_may_be_a_token(url: str, shown: str) -> None:
    assert redact(url) == shown


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (
            f"https://cdn.example/a.bundle?X-Amz-Signature={SECRET}&X-Amz-Expires=60",
            "https://cdn.example/a.bundle?X-Amz-Signature=***&X-Amz-Expires=***",
        ),
        (
            f"redis://cache:6379/0?db=1&PASSWORD={SECRET}",
            "redis://cache:6379/0?db=***&PASSWORD=***",
        ),
        (f"rediss://cache/0?password={SECRET}", "rediss://cache/0?password=***"),
    ],
)
def test_every_query_value_is_hidden_and_the_names_stay(url: str, shown: str) -> None:
    assert redact(url) == shown


@pytest.mark.parametrize("url", [f"https://cdn.example/a.bundle?{SECRET}", f"redis://c/0?{SECRET}"])
def test_a_query_item_without_a_value_is_hidden_as_it_may_be_a_token(url: str) -> None:
    assert SECRET not in redact(url)
    assert redact(url).endswith("?***")


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (
            f"https://cdn.example/b;token={SECRET}/x.bundle",
            "https://cdn.example/b;token=***/x.bundle",
        ),
        (f"https://cdn.example/b;{SECRET}/x.bundle", "https://cdn.example/b;***/x.bundle"),
        (
            f"https://cdn.example/a;v=1;sig={SECRET}/b;k={SECRET}?q={SECRET}",
            "https://cdn.example/a;v=***;sig=***/b;k=***?q=***",
        ),
        (f"redis://cache/0;password={SECRET}", "redis://cache/0;password=***"),
    ],
)
def test_every_path_parameter_is_hidden_as_a_query_item_is(url: str, shown: str) -> None:
    """Servers read `;name=value` in a path segment as they read a query (a token, a session)."""
    assert redact(url) == shown


@pytest.mark.parametrize(
    "url",
    [
        f"https://u:{SECRET}@cdn.example/a.bundle",
        f"https://cdn.example/b;token={SECRET}/x.bundle",
        f"https://cdn.example/a.bundle?sig={SECRET}",
        f"redis://:{SECRET}@cache:6379/0?password={SECRET}",
    ],
)
def test_a_client_s_message_quoting_its_url_whole_or_in_pieces_shows_no_secret(url: str) -> None:
    # As httpx and coredis word theirs: the URL whole, quoted, or a piece taken for a port.
    for message in (
        f"Error connecting to {url}: Connection refused.",
        f"Invalid URL {url!r}; see the documentation",
        f"Invalid port: '{SECRET}'",
        f"redirected to https://other.example/c;sig=0ther-T0ken/y and then {url}",
    ):
        shown = redact_in(message, url)
        assert SECRET not in shown and "0ther-T0ken" not in shown, shown
    assert redact_in(f"Error connecting to {url}: refused.", url).endswith(": refused.")


def test_a_path_parameter_in_free_text_hides_the_rest_of_the_text() -> None:
    text = f"GET https://cdn.example/b;token={SECRET}/x.bundle 200 OK"
    assert redact_urls_in(text) == "GET https://cdn.example/b;***"


@pytest.mark.parametrize(
    "url", [f"https://cdn.example/a.bundle#token={SECRET}", f"redis://cache/0#{SECRET}"]
)
def test_the_fragment_is_dropped(url: str) -> None:
    assert SECRET not in redact(url)
    assert "#" not in redact(url)


@pytest.mark.parametrize(
    "url",
    [
        f"redis://:{SECRET}#tail@127.0.0.1:6390/0",
        f"redis://:{SECRET}/tail@127.0.0.1:6390/0",
        f"redis://:{SECRET}?tail@127.0.0.1:6390/0",
        f"https://reader:{SECRET}#tail@cdn.example/a.bundle?sig=x",
        f"https://{SECRET}/tail@cdn.example/a.bundle",
        f"redis:/:{SECRET}@host",
    ],
)
def test_a_password_the_parser_cut_short_is_hidden_with_all_before_the_last_at(url: str) -> None:
    """A `#`, `/` or `?` in a password ends the host part for the parser."""
    shown = redact(url)
    assert SECRET not in shown and "tail" not in shown
    assert shown.partition("://")[2].startswith("***@")
    assert "sig=x" not in shown


def test_the_host_and_port_are_shown_as_given() -> None:
    assert redact(f"rediss://fleet:{SECRET}@[::1]:63 79/0") == "rediss://***@[::1]:63 79/0"
    assert redact("redis://cache:notaport/0") == "redis://cache:notaport/0"


def test_a_url_without_credentials_is_shown_unchanged() -> None:
    for url in ("redis://127.0.0.1:6390/0", "https://cdn.example/bundles/a.bundle"):
        assert redact(url) == url


def test_a_url_the_parser_refuses_is_not_shown_at_all() -> None:
    assert redact(f"redis://:{SECRET}\uff03@127.0.0.1:6390/0") == "<an unparsable URL>"


def test_a_bundle_url_is_http_or_https_in_any_case() -> None:
    assert is_http_url("https://cdn.example/a.bundle") and is_http_url("HTTP://cdn/a")
    assert not is_http_url("redis://cache/0") and not is_http_url("/srv/a.bundle")
    assert not is_http_url(None)


def test_a_redis_url_is_returned_as_given() -> None:
    for url in ("redis://cache", "rediss://:pw@cache:6380/3", "redis://[::1]:6379/"):
        assert check_redis_url(url) == url


@pytest.mark.parametrize(
    ("url", "said"),
    [
        (f"https://:{SECRET}@cache/0", "is not a Redis URL"),
        (f"redis://:{SECRET}@cache:notaport/0", "has a malformed port 'notaport'"),
        (f"redis://:{SECRET}@cache/db0", "has a malformed database number 'db0'"),
        (f"redis://:{SECRET}#x@cache/0", "is not a valid URL"),
        (None, "must be a redis:// or rediss:// URL, got NoneType"),
    ],
)
def test_a_url_that_names_no_redis_server_is_a_remote_error_naming_the_setting(
    url: object, said: str
) -> None:
    with pytest.raises(RemoteError, match=f"^the key 'remote'.*{said}") as raised:
        check_redis_url(url, "the key 'remote'")
    assert isinstance(raised.value, WarmenvError)
    assert SECRET not in str(raised.value)


def test_a_malformed_database_number_is_named_with_its_path_parameters_hidden() -> None:
    with pytest.raises(
        RemoteError, match="malformed database number '0;token=\\*\\*\\*'"
    ) as raised:
        check_redis_url(f"redis://cache/0;token={SECRET}")
    assert SECRET not in str(raised.value)
