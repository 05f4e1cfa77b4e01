#!/bin/bash
# Turns a fresh set of namespaces into a Proxmox-like sandbox host. Runs INSIDE the host's
# network, mount and UTS namespaces (orch enters them with nsenter); every mount below is
# private to the host and vanishes with its namespaces, so `down` has nothing to unmount.
#
# usage: host-setup.sh NAME HOSTDIR
#   HOSTDIR holds home/ (root's HOME), lxc/ (/var/lib/lxc), etc-upper/ + etc-work/ (an
#   overlay over /etc that adds /etc/pve and the host's /etc/hostname), pve/ (/etc/pve)
#   and cgroup-aside/ (an empty directory used while /sys is replaced).
set -euo pipefail

name=$1
hostdir=$2

# Refuse to touch the machine: these mounts must only ever happen in a host's own
# mount namespace (PID 1 lives in the machine's).
if [ "$(readlink /proc/self/ns/mnt)" = "$(readlink /proc/1/ns/mnt)" ]; then
    echo "host-setup.sh: still in the machine's mount namespace, refusing" >&2
    exit 1
fi

hostname "$name"

# Network: loopback, and the host's end of the veth with its fixed link-local address.
# nodad: the address is usable at once instead of after duplicate address detection.
ip -batch - <<'END'
link set dev lo up
link set dev eth0 addrgenmode none
addr add fe80::2/64 dev eth0 nodad
link set dev eth0 up
END

# A sysfs of this network namespace (LXC reads /sys/class/net), with the machine's cgroup
# tree moved back on top: a fresh sysfs would hide it and LXC fails "Failed to setup
# cgroup limits" (this is why `ip netns exec` cannot be used, see docs/design/sandbox.md).
mount --rbind /sys/fs/cgroup "$hostdir/cgroup-aside"
mount -t sysfs sysfs /sys
mount --move "$hostdir/cgroup-aside" /sys/fs/cgroup

# /etc: the machine's, plus this host's hostname and an /etc/pve mount point, without
# writing anything into the machine's /etc.
mount -t overlay overlay \
    -o "lowerdir=/etc,upperdir=$hostdir/etc-upper,workdir=$hostdir/etc-work" /etc
mount --bind "$hostdir/pve" /etc/pve

# root's HOME: a minimal one (the machine's /root runs pyenv init on every SSH command).
mount --bind "$hostdir/home" /root

# LXC state of this host only: container configs and rootfs, and its runtime directory.
mount --bind "$hostdir/lxc" /var/lib/lxc
mount -t tmpfs -o mode=0755 tmpfs /run/lxc
