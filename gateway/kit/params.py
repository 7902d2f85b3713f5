"""Validated path parameters shared by the routers (bad values are a 422 naming the field)."""

from typing import Annotated

from fastapi import Path

from gateway.kit.names import ACCOUNT_NAME_RE, POSIX_USER_RE

AccountName = Annotated[str, Path(pattern=ACCOUNT_NAME_RE, description="Account name.", examples=["team-a"])]
UserName = Annotated[str, Path(pattern=POSIX_USER_RE, description="POSIX user name.", examples=["alice"])]
