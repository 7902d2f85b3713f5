"""Shared definitions: the names the gateway validates and the pools it knows, in one place.

Patterns are anchored (``^...$``) and used with ``fullmatch``: a name matches as a whole.
"""

import re

# An account name: a DNS label (Slurm accounts and Kubernetes labels both accept it).
ACCOUNT_NAME_RE = r"^[a-z0-9][a-z0-9-]{0,62}$"
ACCOUNT_NAME = re.compile(ACCOUNT_NAME_RE)
# A POSIX user name as the clusters' accounts use it.
POSIX_USER_RE = r"^[a-z_][a-z0-9_-]{0,31}$"
# A job's name.
JOB_NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"

# A GPU type as a job, a pool and a reservation name it (compared without case).
GPU_TYPE_RE = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,31}$"
# A node's host name as Slurm and Kubernetes write it (a maintenance window's nodes).
NODE_NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"
NODE_NAME = re.compile(NODE_NAME_RE)

# A pool's name: a DNS label (pools are data: the ``pool`` table, docs/pools.md).
POOL_NAME_RE = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
POOL_NAME = re.compile(POOL_NAME_RE)
# The width of every column that holds a pool name (the pattern allows 63 characters).
POOL_NAME_LEN = 63
