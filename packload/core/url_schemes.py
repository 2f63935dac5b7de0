"""What packload knows of URLs' schemes: which strings are URLs, which extra installs a scheme's
filesystem, and how its users give credentials and another endpoint (named in errors)."""

from __future__ import annotations

import re

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")
# The extra of pyproject.toml that installs each scheme's filesystem.
EXTRA_OF_SCHEME = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs"}
# What each scheme's users set for credentials, and for another endpoint (an S3-compatible server,
# a GCS emulator); named in the errors about them.
CREDENTIALS_OF_SCHEME = {
    "s3": "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or a profile in ~/.aws/credentials), or pass "
          "storage_options={'anon': True} for a public bucket",
    "gs": "set GOOGLE_APPLICATION_CREDENTIALS to a service account's key file (or run `gcloud auth "
          "application-default login`), or pass storage_options={'token': 'anon'} for a public bucket",
}
ENDPOINT_OF_SCHEME = {"s3": "AWS_ENDPOINT_URL", "gs": "STORAGE_EMULATOR_HOST"}
_SCHEME_FAMILY = {"s3a": "s3", "gcs": "gs"}


def is_url(path: object) -> bool:
    """True for a URL string (``scheme://...``); a local path, str or ``PathLike``, is not one."""
    return isinstance(path, str) and bool(_URL.match(path))


def scheme_of(url: str) -> str:
    return url.split("://", 1)[0].lower()


def scheme_family(url: str) -> str:
    """``url``'s scheme, its aliases taken as the store's own (``s3a`` is ``s3``, ``gcs`` is ``gs``)."""
    scheme = scheme_of(url)
    return _SCHEME_FAMILY.get(scheme, scheme)


def install_hint(url: str) -> str:
    """The command that installs what ``url`` needs."""
    extra = EXTRA_OF_SCHEME.get(scheme_of(url))
    return f'pip install -e ".[{extra}]"' if extra else 'pip install -e ".[s3]" (fsspec, and the filesystem package of the URL\'s scheme)'


def credentials_hint(url: str) -> str:
    """How a user of ``url``'s store gives it credentials."""
    return CREDENTIALS_OF_SCHEME.get(scheme_family(url), "pass the credentials the filesystem of this URL takes in "
                                                         "storage_options (see its documentation)")


def endpoint_hint(url: str) -> str:
    """What to check when ``url``'s store cannot be reached."""
    variable = ENDPOINT_OF_SCHEME.get(scheme_family(url))
    where = f" ({variable} or storage_options' endpoint_url, if you use another server)" if variable else ""
    return f"check the endpoint{where} and the network"
