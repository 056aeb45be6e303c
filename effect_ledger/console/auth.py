"""Who may write through the console: a token (``--token`` / ``EFFECTS_CONSOLE_TOKEN``) and/or
users from a basic-auth file (``--basic-auth-file``: ``user:password`` lines, ``#`` comments).
Without either the console is read-only. Comparisons are constant-time."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from pathlib import Path

from effect_ledger._files import NotRegularFile, read_regular
from effect_ledger.errors import ConfigError
from effect_ledger.streams.config import same_secret

MAX_AUTH_FILE_BYTES = 64 * 1024


class Unauthorized(Exception):
    """Credentials were needed and the request's were missing or wrong (401)."""


@dataclass(frozen=True)
class Credentials:
    token: str | None = None
    users: dict[str, str] = field(default_factory=dict)

    @property
    def configured(self) -> bool:
        return bool(self.token or self.users)

    def check_password(self, user: str, password: str) -> bool:
        expected = self.users.get(user)
        return expected is not None and same_secret(password, expected)

    def check_token(self, token: str) -> bool:
        return bool(self.token) and same_secret(token, self.token or "")

    def identity(self, authorization: str | None, user: str = "", secret: str = "") -> str | None:
        """The authenticated user name from an ``Authorization`` header (Bearer or Basic) or from a
        form's user and secret fields; ``None`` for a token (the caller names the operator).
        Raises ``Unauthorized`` when nothing matches, or when no credentials are configured."""
        if not self.configured:
            raise Unauthorized("this console is read-only: it was started without --token or --basic-auth-file")
        if authorization:
            scheme, _, value = authorization.partition(" ")
            if scheme.lower() == "bearer" and self.check_token(value.strip()):
                return None
            if scheme.lower() == "basic":
                try:
                    u, _, p = base64.b64decode(value.strip(), validate=True).decode().partition(":")
                except ValueError:  # not base64 (binascii.Error), not ASCII, not UTF-8 once decoded
                    raise Unauthorized("malformed basic credentials") from None
                if self.check_password(u, p):
                    return u
            raise Unauthorized("wrong credentials")
        if secret and user and self.check_password(user, secret):
            return user
        if secret and self.check_token(secret):
            return None
        raise Unauthorized("wrong or missing credentials")


def load_users(path: str) -> dict[str, str]:
    """``user:password`` per line; a missing, oversized, non-regular or malformed file is a
    ``ConfigError``."""
    p = Path(path)
    try:
        # The size is bounded by what is read, not by st_size, which is 0 for a device.
        data = read_regular(p, MAX_AUTH_FILE_BYTES + 1)
        if len(data) > MAX_AUTH_FILE_BYTES:
            raise ConfigError(f"{p}: a basic-auth file is at most {MAX_AUTH_FILE_BYTES} bytes")
        text = data.decode("utf-8")
    except NotRegularFile:
        raise ConfigError(f"{p}: a basic-auth file must be a regular file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read the basic-auth file {p}: {e}") from None
    users = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        user, sep, password = line.partition(":")
        if not sep or not user or not password:
            raise ConfigError(f"{p} line {n}: expected user:password")
        users[user] = password
    if not users:
        raise ConfigError(f"{p}: no user:password line")
    return users
