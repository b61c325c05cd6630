#!/usr/bin/env bash
# npm run image: builds the one SPACE runtime image with buildah (no Docker daemon, no registry).
#
#   SPACE_IMAGE_TAG              tag to build (default localhost/space:<package.json version>)
#   SPACE_IMAGE_CACHE            cache directory for the Debian base rootfs (default /var/cache/space-image)
#   SPACE_DEBIAN_MIRROR          Debian archive for debootstrap (default http://deb.debian.org/debian)
#   SPACE_FIRECRACKER_BINARY     \
#   SPACE_JAILER_BINARY           } paths of VMM binaries to put in /usr/local/bin of the image
#   SPACE_CLOUD_HYPERVISOR_BINARY/  (not in Debian; download them from their releases yourself)
#
# The base is Debian bookworm made by debootstrap from Debian's archive (a registry is not
# needed), then scripts/host-deps.sh installs what an agent node needs (runsc, qemu, nftables...),
# then the Node 24 binary and the app with its production dependencies only (no Pulumi packages).
# `buildah build --layers` caches each step: a code change rebuilds only the app layer.
# Needs root (debootstrap; buildah with the host's storage). Prints the tag last.
set -euo pipefail
cd "$(dirname "$0")/.."

version=$(node -p "require('./package.json').version")
tag=${SPACE_IMAGE_TAG:-localhost/space:$version}
cache=${SPACE_IMAGE_CACHE:-/var/cache/space-image}
mirror=${SPACE_DEBIAN_MIRROR:-http://deb.debian.org/debian}
suite=bookworm

for tool in buildah debootstrap; do
  command -v "$tool" >/dev/null || {
    echo "image: $tool is missing (apt-get install -y buildah debootstrap)" >&2
    exit 1
  }
done
node_major=$(node -p 'process.versions.node.split(".")[0]')
if [ "$node_major" != 24 ]; then
  echo "image: node $(node --version) on PATH; the image carries this binary and needs Node 24 (export PATH=\$PWD/node_modules/.bin:\$PATH)" >&2
  exit 1
fi

mkdir -p "$cache"
rootfs_tar="$cache/rootfs-$suite-minbase.tar"
if [ ! -s "$rootfs_tar" ]; then
  echo "image: debootstrap $suite (minbase) from $mirror"
  tmp=$(mktemp -d "$cache/rootfs.XXXXXX")
  debootstrap --variant=minbase "$suite" "$tmp/rootfs" "$mirror" >"$tmp/debootstrap.log" 2>&1 || {
    tail -20 "$tmp/debootstrap.log" >&2
    exit 1
  }
  # deterministic enough for layer caching: buildah keys ADD on the tar's content
  tar --sort=name --mtime=@0 --numeric-owner -C "$tmp/rootfs" -cf "$rootfs_tar.tmp" .
  mv "$rootfs_tar.tmp" "$rootfs_tar"
  rm -rf "$tmp"
fi

ctx=$(mktemp -d "${TMPDIR:-/tmp}/space-image-ctx.XXXXXX")
trap 'rm -rf "$ctx"' EXIT
cp Containerfile "$ctx/Containerfile"
ln "$rootfs_tar" "$ctx/rootfs.tar" 2>/dev/null || cp "$rootfs_tar" "$ctx/rootfs.tar"
cp scripts/host-deps.sh "$ctx/host-deps.sh"
cp "$(command -v node)" "$ctx/node"
mkdir -p "$ctx/vmm"
for pair in "SPACE_FIRECRACKER_BINARY:firecracker" "SPACE_JAILER_BINARY:jailer" "SPACE_CLOUD_HYPERVISOR_BINARY:cloud-hypervisor"; do
  var=${pair%%:*}
  name=${pair#*:}
  src=${!var:-}
  if [ -n "$src" ]; then
    [ -x "$src" ] || {
      echo "image: $var=$src is not an executable file" >&2
      exit 1
    }
    cp "$src" "$ctx/vmm/$name"
    echo "image: $name from $src"
  fi
done
node scripts/image-context.ts "$ctx"

buildah build --layers --pull=false --isolation "${SPACE_IMAGE_ISOLATION:-chroot}" -f "$ctx/Containerfile" -t "$tag" "$ctx"
echo "$tag"
