#!/usr/bin/env bash
# Install Debian's Nsight Systems 2022.4 (nsys, its importer, `nsys stats`) into a folder, for tests on a CPU box.
#
# Usage: tools/install_nsys_debian.sh [PREFIX]    (default: the repository's .venv/nsys-debian)
#
# Needs apt-get, dpkg (a Debian machine) and the network. Leaves the machine's apt configuration alone: the
# package lists and .deb files go to a temporary folder, removed afterwards; only PREFIX is written.
# Prints the path of the installed nsys on stdout (the last line); does nothing when PREFIX already holds one.
# Without a GPU this nsys records NVTX ranges and OS calls (no CUDA kernels); it exports and summarizes reports.
set -euo pipefail

case ${1:-} in
  -h | --help) sed -n '2,/^set /{/^set /d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
esac

prefix=$(realpath -m "${1:-$(dirname "$0")/../.venv/nsys-debian}")
nsys_bin=$prefix/usr/lib/nsight-systems/bin/nsys
if [[ -x $nsys_bin ]]; then
  echo "$nsys_bin"
  exit 0
fi
for tool in apt-get dpkg; do
  command -v "$tool" >/dev/null || { echo "install_nsys_debian: needs $tool (a Debian-based machine)" >&2; exit 1; }
done

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

# The machine's own Debian mirrors, with the non-free component where Nsight Systems lives.
suite=$(. /etc/os-release && echo "${VERSION_CODENAME:?no VERSION_CODENAME in /etc/os-release}")
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
signed=$([[ -r $keyring ]] && echo "[signed-by=$keyring] " || true)
mapfile -t mirrors < <(
  { sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/*.sources 2>/dev/null
    awk '$1 == "deb" && $2 !~ /^\[/ {print $2}' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null
  } | tr ' ' '\n' | grep -v -e security -e '^$' | sort -u
)
((${#mirrors[@]})) || mirrors=(http://deb.debian.org/debian)
for mirror in "${mirrors[@]}"; do
  echo "deb ${signed}$mirror $suite main non-free"
done >"$scratch/sources.list"

mkdir -p "$scratch/lists/partial" "$scratch/debs"
apt_options=(
  -o "Dir::Etc::SourceList=$scratch/sources.list" -o Dir::Etc::SourceParts=/dev/null
  -o "Dir::State::Lists=$scratch/lists" -o "Dir::Cache::Archives=$scratch/debs"
  -o Debug::NoLocking=1 -o APT::Sandbox::User="$(id -un)"
)
if ! apt-get "${apt_options[@]}" -qq update >"$scratch/update.log" 2>&1; then
  echo "install_nsys_debian: apt-get update failed:" >&2
  tail -5 "$scratch/update.log" >&2
  exit 1
fi
# nsight-systems holds the host side (importer, stats), -target the nsys CLI; the importer links libssh.
(cd "$scratch/debs" && apt-get "${apt_options[@]}" -qq download nsight-systems nsight-systems-target libssh-4)

mkdir -p "$prefix"
for deb in "$scratch"/debs/*.deb; do
  dpkg -x "$deb" "$prefix"
done
# nsys looks for host-linux-x64 beside the real folder of target-linux-x64, and the importer dlopens libssh.so.
ln -sfn ../../nsight-systems/host-linux-x64 "$prefix/usr/lib/x86_64-linux-gnu/nsight-systems/host-linux-x64"
ln -sfn ../../x86_64-linux-gnu/libssh.so.4 "$prefix/usr/lib/nsight-systems/host-linux-x64/libssh.so"
"$nsys_bin" --version >&2
echo "$nsys_bin"
