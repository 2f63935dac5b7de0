"""URLs as packload shows them: without the secrets some of them carry.

A signed URL (``https://bucket.s3.amazonaws.com/p.lmdb?X-Amz-Credential=...&X-Amz-Signature=...``)
or one with a user and password (``https://user:secret@host/p.lmdb``) works as a pack's address, but
what it carries past the path is a credential: whoever reads a log line, an error or ``--json``
output could use it. ``display_url`` is the one way a URL is shown (errors, ``info``, progress,
summaries): the user and password are dropped, and every value of the query string and the
fragment is replaced by ``REDACTED`` (the names stay, they say what was there). ``redact_text`` does
the same to every URL inside a text that packload did not write (a store client's error message),
and to ``name=value`` pairs of signature and credential parameters found outside a URL.
"""

from __future__ import annotations

import re

REDACTED = "REDACTED"
# A URL inside free text: a scheme, then everything up to a space, a quote or a bracket.
_URL_IN_TEXT = re.compile(r"""[A-Za-z][A-Za-z0-9+.\-]*://[^\s'"<>()\[\]{}]+""")
# Query parameters that carry a credential, wherever they are written (AWS and GCS signatures, SAS
# tokens, OAuth tokens, and the generic names).
_SECRET_PARAMETER = re.compile(
    r"(?i)\b(x-amz-[a-z-]*|x-goog-[a-z-]*|signature|sig|se|sp|sv|sr|skoid|sktid|token|access_token|"
    r"id_token|refresh_token|api[_-]?key|key|password|passwd|secret|credential|awsaccesskeyid|"
    r"googleaccessid|policy|expires)=([^&\s'\"<>]+?)(?=[,;.)\]}]{0,8}(?:[&\s'\"<>]|$))")
# (a value ends before the punctuation that ends its sentence or bracket: ``(sig=abc),`` keeps ``),``)


def _redact_pairs(text: str) -> str:
    """Every ``name=value`` of ``text`` (a query string or fragment) with its value redacted."""
    pairs = []
    for pair in text.split("&"):
        name, sep, _ = pair.partition("=")
        pairs.append(f"{name}={REDACTED}" if sep else (REDACTED if pair else pair))
    return "&".join(pairs)


def _one(url: str) -> str:
    """``display_url`` of a URL with no ``::`` chaining."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    rest, qmark, query = rest.partition("?")
    rest, hashmark, fragment = rest.partition("#")
    if qmark and "#" in query:
        query, _, fragment = query.partition("#")
        hashmark = "#"
    authority, slash, path = rest.partition("/")
    if "@" in authority:  # user[:password]@host: the credentials go
        authority = authority.rsplit("@", 1)[1]
    shown = f"{scheme}://{authority}{slash}{path}"
    if qmark:
        shown += "?" + _redact_pairs(query)
    if hashmark:
        shown += "#" + _redact_pairs(fragment)
    return shown


def display_url(url: str) -> str:
    """``url`` as it may be shown: no user or password, every query and fragment value redacted
    (fsspec's chained URLs, ``simplecache::s3://...``, each link redacted)."""
    if "::" in url:
        return "::".join(_one(part) for part in url.split("::"))
    return _one(url)


def redact_text(text: str) -> str:
    """``text`` (a message from a store's client) with every URL in it shown by ``display_url``, and
    the values of signature and credential parameters outside URLs redacted."""
    text = _URL_IN_TEXT.sub(lambda match: display_url(match.group(0)), text)
    return _SECRET_PARAMETER.sub(lambda match: f"{match.group(1)}={REDACTED}"
                                 if match.group(2) != REDACTED else match.group(0), text)
