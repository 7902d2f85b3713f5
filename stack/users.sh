# The stack's test users and their uids, the same on every pool: the Slurm clusters' POSIX
# users (stack/slurm/up.sh) and the real Kubernetes node's uid_map (stack/kube/node.sh).
STACK_USERS="alice:2001 bob:2002 carol:2003"
