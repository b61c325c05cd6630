#!/usr/bin/env bash
# Installs the Debian packages the SPACE runtime and its tests need on a node.
# Idempotent: checks each package with `dpkg -s` and does nothing when all are present.
# Must run as root when something is missing (exits 1 with a message otherwise).
#
# runsc comes from Debian 13 (trixie): Debian 12's runsc (2022-12) cannot checkpoint a sandbox
# with live TCP endpoints and lacks the systrap platform; trixie's (2024-07-29) is a static binary
# that runs on Debian 12. The trixie source is pinned so that runsc is the only package apt ever
# takes from it (every other trixie package gets priority -1: never installed, never upgraded to).
set -euo pipefail

# qemu-system-x86: the qemu driver (microVMs; software emulation without KVM). cpio, gzip, lz4: VM
# initrd and the ELF kernel extracted from Debian's cloud kernel (vm-image.ts). procps: sysctl, which
# the VM drivers' network setup runs in each sandbox namespace (a minbase image has none).
# prometheus: its promtool checks and unit-tests the alert rules (providers/observability/alerts.test.ts).
# redis-sentinel: the sentinels of `space up --ha` and the failover suite (runtime/cli/redis-ha.ts).
# haproxy: the front of `space up --ha` (one URL for two APIs and for two routers, /readyz checks).
# runsc comes below.
PACKAGES=(redis-server nftables iproute2 debootstrap busybox-static tini e2fsprogs util-linux ca-certificates qemu-system-x86 cpio gzip lz4 xz-utils zstd procps prometheus redis-sentinel haproxy)
# Oldest runsc version accepted (Debian's version string of the 2024-07-29 release).
RUNSC_MIN='0.0~20240729'
TRIXIE_SOURCE=/etc/apt/sources.list.d/space-trixie-runsc.sources
TRIXIE_PIN=/etc/apt/preferences.d/space-trixie-runsc

missing=()
for pkg in "${PACKAGES[@]}"; do
  if ! dpkg -s "$pkg" >/dev/null 2>&1; then
    missing+=("$pkg")
  fi
done
runsc_version=$(dpkg-query -W -f='${Version}' runsc 2>/dev/null || true)
need_runsc=1
if [ -n "$runsc_version" ] && dpkg --compare-versions "$runsc_version" ge "$RUNSC_MIN"; then
  need_runsc=0
fi
. /etc/os-release
# on Debian 13 or later the distribution's own runsc is new enough
own_release_runsc=0
if [ "${ID:-}" = debian ] && [ "${VERSION_ID%%.*}" -ge 13 ] 2>/dev/null; then own_release_runsc=1; fi

if [ "${#missing[@]}" -eq 0 ] && [ "$need_runsc" -eq 0 ]; then
  echo "host-deps: all $((${#PACKAGES[@]} + 1)) packages present (runsc $runsc_version)"
  exit 0
fi

echo "host-deps: missing: ${missing[*]}$([ "$need_runsc" -eq 1 ] && echo " runsc>=$RUNSC_MIN (have: ${runsc_version:-none})")"
if [ "$(id -u)" -ne 0 ]; then
  echo "host-deps: must run as root to install them (try: sudo bash scripts/host-deps.sh)" >&2
  exit 1
fi

export DEBIAN_FRONTEND=noninteractive
if [ "$need_runsc" -eq 1 ] && [ "$own_release_runsc" -eq 0 ]; then
  echo "host-deps: adding the trixie source, pinned to runsc only"
  cat >"$TRIXIE_SOURCE" <<'EOF'
# Added by SPACE scripts/host-deps.sh: runsc only (see space-trixie-runsc in preferences.d).
Types: deb
URIs: http://deb.debian.org/debian
Suites: trixie
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  # apt uses the first record that matches a package: runsc first, then everything else never
  cat >"$TRIXIE_PIN" <<'EOF'
# Added by SPACE scripts/host-deps.sh: take runsc from trixie, nothing else.
Package: runsc
Pin: release n=trixie
Pin-Priority: 990

Package: *
Pin: release n=trixie
Pin-Priority: -1
EOF
fi
echo "host-deps: apt-get update"
apt-get update
install=("${missing[@]}")
if [ "$need_runsc" -eq 1 ]; then
  if [ "$own_release_runsc" -eq 0 ]; then install+=(runsc/trixie); else install+=(runsc); fi
fi
echo "host-deps: apt-get install -y ${install[*]}"
apt-get install -y --no-install-recommends "${install[@]}"
runsc_version=$(dpkg-query -W -f='${Version}' runsc)
if ! dpkg --compare-versions "$runsc_version" ge "$RUNSC_MIN"; then
  echo "host-deps: runsc $runsc_version installed, need >= $RUNSC_MIN" >&2
  exit 1
fi
echo "host-deps: done (runsc $runsc_version)"
