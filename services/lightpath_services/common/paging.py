"""Pagination as common.proto states it, for every List call.

`page_size` 0 means the service's default and any size is capped at MAX_PAGE;
`page_token` is opaque: the position where the next page starts, base64 so
clients never parse it. A token this service did not hand out is
INVALID_ARGUMENT naming `page_token`.
"""

from __future__ import annotations

import base64
import re

from lightpath.errors import InvalidArgument
from lightpath_services.common.keys import is_valid_id

MAX_PAGE = 1000
_NOT_OURS = "is not a token this service returned"
_POSITION = re.compile(r"[0-9]{1,18}")


def page_size(requested: int, default: int = 100) -> int:
    if requested < 0:
        raise InvalidArgument("page_size", f"must be >= 0 (0 = the default, {default})")
    return min(requested or default, MAX_PAGE)


def page_token(position: int | str) -> str:
    """The token of a next page that starts at `position`."""
    return base64.urlsafe_b64encode(str(position).encode()).decode()


def token_text(token: str) -> str | None:
    """The position `token` names, as text; None for the first page."""
    if not token:
        return None
    try:
        return base64.urlsafe_b64decode(token.encode()).decode()
    except ValueError:  # binascii.Error and UnicodeDecodeError are ValueErrors
        raise InvalidArgument("page_token", _NOT_OURS) from None


def token_int(token: str, *, maximum: int | None = None) -> int | None:
    """The integer position `token` names (an offset or a sequence number); None for the first page."""
    text = token_text(token)
    if text is None:
        return None
    # ASCII digits only (str.isdigit also takes "²", which int() refuses), and no
    # longer than a position can be: the number goes to Redis as a 64-bit integer.
    if not _POSITION.fullmatch(text) or (maximum is not None and int(text) > maximum):
        raise InvalidArgument("page_token", _NOT_OURS)
    return int(text)


def token_id(token: str) -> str | None:
    """The id `token` names (a cursor: the last id of the previous page); None for the first page."""
    text = token_text(token)
    if text is not None and not is_valid_id(text):
        raise InvalidArgument("page_token", _NOT_OURS)
    return text
