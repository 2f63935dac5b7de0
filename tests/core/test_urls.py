"""URLs as packload shows them (``packload.core.urls``): the exact text of ``display_url`` at the edges
of a URL's grammar, and ``redact_text`` on a store client's words. (A signed URL, a user and password,
a chained URL and a token in a fragment are in tests/core/test_remote.py.)"""

from __future__ import annotations

import pytest

from packload.core.urls import REDACTED, display_url, redact_text


@pytest.mark.parametrize(("url", "shown"), [
    # every value of the query goes, names stay; a bare word and an empty name's value go too
    ("https://h/p?a=1&b&=c&", f"https://h/p?a={REDACTED}&{REDACTED}&={REDACTED}&"),
    ("https://h/p?x=1#frag", f"https://h/p?x={REDACTED}#{REDACTED}"),
    ("https://h/p?", "https://h/p?"),  # an empty query: nothing to hide
    # a password holding an '@': everything before the last '@' of the authority goes
    ("https://user:p@ss@host/x", "https://host/x"),
    ("https://user:pw@host", "https://host"),
    ("s3://KEY:SECRET@bucket/p.shards", "s3://bucket/p.shards"),
    # an '@' in the path is no user: kept
    ("https://host/a@b/x.lmdb", "https://host/a@b/x.lmdb"),
    # not a URL: shown as given
    ("local/path?x=1", "local/path?x=1"),
    # each link of a chain on its own
    ("simplecache::s3://u:p@b/x::https://h/y?token=t", f"simplecache::s3://b/x::https://h/y?token={REDACTED}"),
])
def test_display_url(url: str, shown: str) -> None:
    assert display_url(url) == shown


def test_display_url_of_what_it_showed_is_the_same() -> None:
    url = "https://u:pw@h/p.lmdb?X-Amz-Signature=abc&X-Amz-Expires=600#k=v"
    once = display_url(url)
    assert display_url(once) == once and "pw" not in once and "abc" not in once and "600" not in once


@pytest.mark.parametrize(("text", "shown"), [
    ("see (https://u:p@h/x) now", "see (https://h/x) now"),  # brackets end the URL
    ("'https://h/p?sig=1' failed", f"'https://h/p?sig={REDACTED}' failed"),
    ("GET https://h/p?X-Amz-Signature=abc failed", f"GET https://h/p?X-Amz-Signature={REDACTED} failed"),
    # credential parameters outside a URL, any case; other words left alone
    ("X-Amz-Signature=abc monkey=banana api-key=zz size=5 Expires=9",
     f"X-Amz-Signature={REDACTED} monkey=banana api-key={REDACTED} size=5 Expires={REDACTED}"),
    ("Password=hunter2&x-goog-credential=c", f"Password={REDACTED}&x-goog-credential={REDACTED}"),
    ("no secrets here: 403 Forbidden", "no secrets here: 403 Forbidden"),
    # punctuation after a value is the sentence's, kept; inside a value it is the value's, redacted
    ("failed (sig=s, key=k). retry", f"failed (sig={REDACTED}, key={REDACTED}). retry"),
    ("password=pa,ss;w) end", f"password={REDACTED}) end"),
])
def test_redact_text(text: str, shown: str) -> None:
    assert redact_text(text) == shown


def test_redact_text_twice_is_once() -> None:
    text = "error at https://u:p@h/p?token=t with sig=s key=k"
    once = redact_text(text)
    assert redact_text(once) == once
    assert once == f"error at https://h/p?token={REDACTED} with sig={REDACTED} key={REDACTED}"
