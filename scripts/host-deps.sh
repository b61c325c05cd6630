#!/usr/bin/env bash
# Installs the Debian packages the SPACE runtime and its tests need on a node.
# Idempotent: checks each package with `dpkg -s` and does nothing when all are present.
# Must run as root when something is missing (exits 1 with a message otherwise).
set -euo pipefail

# qemu-system-x86: the qemu driver (microVMs; software emulation without KVM). cpio, gzip, lz4: VM
# initrd and the ELF kernel extracted from Debian's cloud kernel (vm-image.ts).
PACKAGES=(runsc redis-server nftables iproute2 debootstrap busybox-static tini e2fsprogs util-linux ca-certificates qemu-system-x86 cpio gzip lz4 xz-utils zstd)

missing=()
for pkg in "${PACKAGES[@]}"; do
  if ! dpkg -s "$pkg" >/dev/null 2>&1; then
    missing+=("$pkg")
  fi
done

if [ "${#missing[@]}" -eq 0 ]; then
  echo "host-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

echo "host-deps: missing: ${missing[*]}"
if [ "$(id -u)" -ne 0 ]; then
  echo "host-deps: must run as root to install them (try: sudo bash scripts/host-deps.sh)" >&2
  exit 1
fi

export DEBIAN_FRONTEND=noninteractive
echo "host-deps: apt-get update"
apt-get update
echo "host-deps: apt-get install -y ${missing[*]}"
apt-get install -y --no-install-recommends "${missing[@]}"
echo "host-deps: done"
