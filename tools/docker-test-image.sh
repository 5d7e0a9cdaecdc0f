#!/usr/bin/env bash
# Builds the tiny images the ssh executor's Docker tests run (flowmesh-test-busybox:latest, and
# flowmesh-test-sshd:latest for interactive sessions) from
# Debian's static busybox, with no registry access: apt-get download, extract, `docker import`.
# Safe to run again: it does nothing when the image already exists. Needs Docker and apt (root).
set -euo pipefail

IMAGE=${FLOWMESH_TEST_IMAGE:-flowmesh-test-busybox:latest}
SSHD_IMAGE=${FLOWMESH_TEST_SSHD_IMAGE:-flowmesh-test-sshd:latest}

command -v docker >/dev/null || { echo "docker-test-image: docker is not on PATH" >&2; exit 1; }
have() { docker image inspect "$1" >/dev/null 2>&1; }
if have "$IMAGE" && have "$SSHD_IMAGE"; then
  echo "docker-test-image: $IMAGE and $SSHD_IMAGE already exist"
  exit 0
fi
command -v apt-get >/dev/null || { echo "docker-test-image: apt-get is not available (Debian or Ubuntu needed)" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"

# A fresh machine may have no package lists yet: update once, only when the download needs it.
if ! apt-get download -q busybox-static >/dev/null 2>&1; then
  echo "docker-test-image: refreshing the package lists"
  apt-get update -qq
  apt-get download -q busybox-static
fi
deb=$(ls busybox-static_*.deb)
dpkg-deb -x "$deb" pkg
busybox=pkg/bin/busybox
[ -x "$busybox" ] || { echo "docker-test-image: $deb holds no bin/busybox" >&2; exit 1; }

root=rootfs
mkdir -p "$root/bin" "$root/usr/bin" "$root/etc" "$root/tmp" "$root/root" "$root/flowmesh"
chmod 1777 "$root/tmp"
cp "$busybox" "$root/bin/busybox"
# One link per applet (sh, echo, sleep, cat, ls, ...): the list comes from the binary itself,
# which is static and so runs on the host as it will in the container.
for applet in $("$busybox" --list); do
  [ "$applet" = busybox ] || ln -sf busybox "$root/bin/$applet"
done
ln -sf ../../bin/env "$root/usr/bin/env"
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$root/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"

if have "$IMAGE"; then
  echo "docker-test-image: $IMAGE already exists"
else
  tar -C "$root" -c . | docker import --change 'CMD ["/bin/sh"]' --change 'ENV PATH=/bin:/usr/bin' - "$IMAGE" >/dev/null
  echo "docker-test-image: built $IMAGE from $deb"
fi

# A second image for interactive sessions: the same busybox plus Debian's dropbear SSH server and
# the libraries it links, with an entrypoint that installs the session's authorized keys.
if have "$SSHD_IMAGE"; then
  echo "docker-test-image: $SSHD_IMAGE already exists"
  exit 0
fi
apt-get download -q dropbear-bin libtomcrypt1 libtommath1 >/dev/null
for deb in dropbear-bin_*.deb libtomcrypt1_*.deb libtommath1_*.deb; do dpkg-deb -x "$deb" sshd-pkg; done
dropbear=sshd-pkg/usr/sbin/dropbear
[ -x "$dropbear" ] || { echo "docker-test-image: dropbear-bin holds no usr/sbin/dropbear" >&2; exit 1; }
mkdir -p "$root/usr/sbin" "$root/etc/dropbear" "$root/root/.ssh"
cp "$dropbear" "$root/usr/sbin/dropbear"
cp -a sshd-pkg/usr/lib "$root/usr/"
# The other libraries come from the host (same Debian release): whatever the loader resolves.
LD_LIBRARY_PATH=$(dirname "$(find sshd-pkg -name 'libtomcrypt.so.1' | head -1)") ldd "$dropbear" |
  awk '/=> \// {print $3} /^[ \t]*\/lib/ {print $1}' | while read -r lib; do
    case "$lib" in */sshd-pkg/*) continue ;; esac
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
  done
cat >"$root/usr/sbin/flowmesh-sshd" <<'SH'
#!/bin/sh
# Installs the session's keys (mounted at /flowmesh/ssh) for root and runs dropbear in the foreground.
set -e
mkdir -p /root/.ssh
cp /flowmesh/ssh/authorized_keys /root/.ssh/authorized_keys
chmod 700 /root/.ssh
chmod 600 /root/.ssh/authorized_keys
exec /usr/sbin/dropbear -F -E -R -s -p 22
SH
chmod 755 "$root/usr/sbin/flowmesh-sshd"
tar -C "$root" -c . | docker import --change 'CMD ["/usr/sbin/flowmesh-sshd"]' --change 'ENV PATH=/bin:/usr/bin:/usr/sbin' --change 'EXPOSE 22' - "$SSHD_IMAGE" >/dev/null
echo "docker-test-image: built $SSHD_IMAGE with $(ls dropbear-bin_*.deb)"
