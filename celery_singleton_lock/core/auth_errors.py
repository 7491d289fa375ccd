"""What to say when Redis refuses the login: the URL lacks the password the server wants, or
carries one the server does not take.

Redis's own words (``HELLO must be called with the client already authenticated ...``,
``NOAUTH ...``, ``WRONGPASS ...``) name a protocol step, not what to fix; the message built
here says that the URL needs a password, where it goes in the URL, and which argument or
setting holds that URL.
"""

from __future__ import annotations

import redis

#: Redis's replies when the client sent no password (RESP3's HELLO, then RESP2's NOAUTH).
_NO_PASSWORD_SENT = ("HELLO must be called", "Authentication required", "NOAUTH")


def is_auth_error(exc: BaseException) -> bool:
    """Whether ``exc`` is Redis refusing the login (no password, or a wrong one)."""
    if isinstance(exc, redis.AuthenticationError):
        return True
    # redis-py maps these prefixes to AuthenticationError; a reply it does not map (a newer
    # server's wording, a proxy) still starts with Redis's error code.
    return isinstance(exc, redis.ResponseError) and str(exc).startswith(("NOAUTH", "WRONGPASS"))


def auth_message(url: str, where: str, exc: BaseException) -> str:
    """One line for a refused login at ``url`` (shown without its password): what is wrong
    and where the password goes; ``where`` names the argument or setting holding the URL."""
    example = _with_password(url)
    if any(text in str(exc) for text in _NO_PASSWORD_SENT):
        return (
            f"Redis at {url} needs a password and the URL has none: put it in the URL, "
            f"{example} (USER:PASSWORD@ for an ACL user); the URL comes from {where}"
        )
    return (
        f"Redis at {url} refused the login (wrong password, or the user is unknown or "
        f"disabled): check the password in the URL, {example}; the URL comes from {where}"
    )


def _with_password(url: str) -> str:
    """``url`` (which has no password) with ``PASSWORD`` where the password goes:
    ``redis://host:6379/0`` -> ``redis://:PASSWORD@host:6379/0``, ``redis://user@host``
    -> ``redis://user:PASSWORD@host``."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    login, at, hosts = rest.partition("@")
    if not at:
        return f"{scheme}://:PASSWORD@{rest}"
    return f"{scheme}://{login.partition(':')[0]}:PASSWORD@{hosts}"
