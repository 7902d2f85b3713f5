"""Who is calling: the result of authentication, used by every authorization check."""

from __future__ import annotations

import dataclasses
from typing import Literal

from gateway.audit.service import Who


@dataclasses.dataclass(frozen=True)
class Principal:
    subject: str  # stable id: "<issuer>|<sub>" is not needed while subs are unique per site
    username: str  # POSIX user for Slurm (from the username claim)
    accounts: frozenset[str]  # gateway accounts the caller may charge and see
    roles: frozenset[str] = frozenset()
    kind: Literal["user", "service"] = "user"
    issuer: str = ""

    @property
    def is_admin(self) -> bool:
        return "admin" in self.roles

    @property
    def who(self) -> Who:
        """The caller as the audit log records it (subject and POSIX user)."""
        return Who(subject=self.subject, username=self.username)

    def may_use(self, account: str) -> bool:
        return self.is_admin or account in self.accounts
