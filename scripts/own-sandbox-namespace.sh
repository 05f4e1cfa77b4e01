#!/usr/bin/env bash
# Runs a command with a sandbox of its own: in a new network and mount namespace, with its
# own state directory and cgroup tree, so that its hosts may have the same names (sb1, sb2)
# and addresses as the machine's sandbox without meeting it. scripts/test.sh starts its
# second pytest-xdist worker of the sandbox's tests this way; that worker's `sandbox` fixture
# brings this sandbox up and, as ORCH_SANDBOX_TEARDOWN=1 says, takes it down at the end.
#
#   scripts/own-sandbox-namespace.sh STATE_DIR COMMAND [ARGS...]
#
# Needs root. Inside the namespace, before COMMAND starts:
#   /run/netns      a fresh tmpfs: `ip netns` names (orch-sb1, ...) are this sandbox's only
#   /sys            a fresh sysfs, showing this network namespace's links (the sandbox reads
#                   /sys/class/net/orch-HOST to see whether a host's link is up); the
#                   machine's /sys/fs/cgroup moved onto it, so the cgroups stay the machine's
#   lo              up: the tests' local servers listen on 127.0.0.1
# Nothing of it is visible outside (private propagation); it ends with the last process in it.
set -euo pipefail
if [ $# -lt 2 ]; then
    echo "usage: $0 STATE_DIR COMMAND [ARGS...]" >&2
    exit 2
fi
state_dir=$1
shift
mkdir -p /run/netns
exec env ORCH_SANDBOX_DIR="$state_dir" ORCH_SANDBOX_CGROUP="$(basename "$state_dir")" \
    ORCH_SANDBOX_TEARDOWN=1 \
    unshare --net --mount --propagation private -- /bin/bash -c '
set -euo pipefail
mount -t tmpfs -o mode=0755 orch-netns /run/netns
keep=$(mktemp -d /run/orch-cgroup-XXXXXX)
mount --rbind /sys/fs/cgroup "$keep"
mount -t sysfs orch-sysfs /sys
mount --move "$keep" /sys/fs/cgroup
rmdir "$keep"
ip link set lo up
exec "$@"' own-sandbox-namespace "$@"
