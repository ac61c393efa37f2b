"""Masking credentials in URLs before they reach a log line or a status print.

Redis and Kafka URLs may carry a password (``redis://user:secret@host:6379/0``). Anything that
prints or logs such a URL passes it through :func:`mask_url`; :class:`CredentialFilter`, which
the command line installs on its log handlers, does the same for every log record, so a URL
quoted inside an exception message (a library's, too) is masked as well::

    >>> mask_url("redis://app:hunter2@10.0.0.5:6379/0")
    'redis://app:***@10.0.0.5:6379/0'
"""

from __future__ import annotations

import logging
import re

__all__ = ["MASK", "CredentialFilter", "mask_credentials", "mask_url"]

MASK = "***"

# scheme://user:password@ — the password ends at the last "@" before the host, so an
# unencoded "@" inside it is masked too; it cannot span a "/" or whitespace, which keeps one
# URL's mask from swallowing the next URL on the same line.
_USERINFO_WITH_PASSWORD = re.compile(
    r"(?P<prefix>\b[A-Za-z][A-Za-z0-9+.-]*://(?P<user>[^\s:/@]*):)(?P<password>[^\s/]+)@"
)


def mask_credentials(text: str) -> str:
    """``text`` with the password of every ``scheme://user:password@`` in it replaced by ``***``."""
    if "://" not in text:  # the common case: no URL at all, no regex work
        return text
    return _USERINFO_WITH_PASSWORD.sub(lambda match: f"{match['prefix']}{MASK}@", text)


def mask_url(url: str | None) -> str:
    """A URL safe to print: ``redis://user:***@host:6379/0``; ``None`` prints as ``-``."""
    if url is None:
        return "-"
    return mask_credentials(url)


class CredentialFilter(logging.Filter):
    """Masks URL passwords in a record's message and traceback (install it on handlers).

    A filter on a handler sees records of every logger that propagates to it, which a filter
    on a logger would not.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        masked = mask_credentials(message)
        if masked != message:
            record.msg, record.args = masked, None
        if record.exc_info and not record.exc_text:
            # Formatted here (the formatter reuses exc_text) so the traceback is masked too.
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = mask_credentials(record.exc_text)
        return True
