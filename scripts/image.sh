#!/usr/bin/env bash
# npm run image: builds the one SPACE runtime image with buildah (no Docker daemon, no registry).
#
#   npm run image [-- --offline] [-- --require firecracker,cloud-hypervisor]
#   SPACE_IMAGE_TAG              tag to build (default localhost/space:<package.json version>)
#   SPACE_IMAGE_CACHE            cache directory for the Debian base rootfs, the baked assets and
#                                the verified VMM downloads (default /var/cache/space-image)
#   SPACE_IMAGE_OFFLINE=1        same as --offline: no VMM downloads (an image of gvisor + qemu)
#   SPACE_DEBIAN_MIRROR          Debian archive for debootstrap (default http://deb.debian.org/debian)
#   SPACE_FIRECRACKER_BINARY     \
#   SPACE_JAILER_BINARY           } VMM binaries to use as given instead of the pinned downloads
#   SPACE_CLOUD_HYPERVISOR_BINARY/
#
# The base is Debian bookworm made by debootstrap from Debian's archive (a registry is not
# needed), then scripts/host-deps.sh installs what an agent node needs (runsc, qemu, nftables...),
# then what scripts/image-assets.ts prepares on this machine: the guest kernel and the default
# templates (/usr/lib/space), Firecracker + jailer and Cloud Hypervisor at the versions and
# checksums pinned in scripts/vmm-releases.json (/usr/local/bin), the labels saying which drivers
# the image can run (dev.space.vmms); then the Node 24 binary and the app with its production
# dependencies only (no Pulumi packages). `buildah build --layers` caches each step: a code
# change rebuilds only the app layer. Needs root (debootstrap; buildah with the host's storage)
# and apt lists on this machine (Debian 12: the guest kernel's package). Prints the tag last.
set -euo pipefail
cd "$(dirname "$0")/.."

assets_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --offline) assets_args+=(--offline) ;;
    --require) assets_args+=(--require "$2"); shift ;;
    *) echo "image: unknown argument $1 (--offline, --require <drivers>)" >&2; exit 2 ;;
  esac
  shift
done

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

# in the cache's filesystem: the large tarballs are hard-linked into the context, not copied
ctx=$(mktemp -d "$cache/ctx.XXXXXX")
trap 'rm -rf "$ctx"' EXIT
cp Containerfile "$ctx/Containerfile"
ln "$rootfs_tar" "$ctx/rootfs.tar" 2>/dev/null || cp "$rootfs_tar" "$ctx/rootfs.tar"
cp scripts/host-deps.sh "$ctx/host-deps.sh"
cp "$(command -v node)" "$ctx/node"
node scripts/image-assets.ts --cache "$cache" --out "$ctx" "${assets_args[@]}"
labels=()
while IFS= read -r l; do labels+=(--label "$l"); done <"$ctx/labels"
node scripts/image-context.ts "$ctx"

# the build names its version (the tag after the last colon): every service reports it
# (GET /healthz, a node's heartbeat), so a version bump can be watched reaching each one
image_version=${tag##*:}
buildah build --layers --pull=false --isolation "${SPACE_IMAGE_ISOLATION:-chroot}" "${labels[@]}" \
  --env "SPACE_VERSION=$image_version" --label "org.opencontainers.image.version=$image_version" \
  -f "$ctx/Containerfile" -t "$tag" "$ctx"
echo "$tag"
