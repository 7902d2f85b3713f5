"""Validated path parameters shared by the routers (bad values are a 422 naming the field)."""

from typing import Annotated

from fastapi import Path

ACCOUNT_NAME_RE = r"^[a-z0-9][a-z0-9-]{0,62}$"
POSIX_USER_RE = r"^[a-z_][a-z0-9_-]{0,31}$"

AccountName = Annotated[str, Path(pattern=ACCOUNT_NAME_RE, description="Account name.", examples=["team-a"])]
UserName = Annotated[str, Path(pattern=POSIX_USER_RE, description="POSIX user name.", examples=["alice"])]
