#!/usr/bin/env bash
# vunet's prerequisites, checked up front: `make demo` runs `setup.sh demo`,
# `make test` and .ci/run run `setup.sh test`.
#
# 1. Go first: go.mod names the version every build needs, and an older go
#    (Debian 12's own golang is 1.19) fails on go.mod with an error that
#    does not say so.
# 2. Then every Debian package the target needs, in one query. As root the
#    missing ones are installed with apt-get (one install command); otherwise
#    the one `apt-get install …` line to run as root is printed and the script
#    exits 2.
#
# 3. `make test` also needs libvirt >= 11.1 (test/ops has libvirtd run vunet
#    as its passt back-end; Debian 12's own libvirt 9.0 refuses passt). On
#    Debian 12 (bookworm) it comes from bookworm-backports: as root the
#    script adds that source when none is configured
#    (/etc/apt/sources.list.d/vunet-bookworm-backports.list) and installs
#    libvirt with -t bookworm-backports, after the other packages, so that
#    nothing else (QEMU, the kernel) is taken from backports. Not root, those
#    steps follow the install on the same printed line (joined by &&).
#
# Only bash builtins are used besides go, dpkg-query, id and apt-get, so a
# test can run the script with a PATH of stand-ins for those four
# (test/setup/setup_test.go); VUNET_SETUP_ROOT (tests only) is prefixed to
# the files it reads and writes: /etc/os-release and /etc/apt.
# VUNET_SKIP_SETUP=1 skips the package check (not the Go one), for
# machines that are not Debian.
set -euo pipefail

# The demo's packages: QEMU and the tiny guest (the host's kernel and
# modules, a static busybox for its initramfs). git: `go build` stamps the
# revision into the binary (vunet --version, vunet_build_info) from the
# checkout. make: a fresh Debian 12 has none, so `make demo` cannot start
# there; running this script first installs it. ca-certificates: without
# it go cannot fetch the modules in go.mod from proxy.golang.org ("x509:
# certificate signed by unknown authority"); debootstrap, the debian:12
# container image and a netinst without "standard system utilities" lack
# it. README's "The two commands" lists exactly these. A package may name
# the command that stands for it (PKG:COMMAND: satisfied when either is
# there, e.g. a QEMU built from source).
DEMO_PACKAGES=(qemu-system-x86:qemu-system-x86_64 linux-image-amd64 busybox-static git make:make ca-certificates)

# What `make test` needs beyond the demo's.
#   gcc libc6-dev   go test -race needs cgo
#   iproute2 kmod cpio udhcpc iperf3   network namespaces, the TAP rig, bench
#   dpdk-dev        dpdk-testpmd, the second vhost-user front-end
#   tshark          reads vunet's --pcap files
#   prometheus      a real scraper and promtool check metrics
#   libxml2-utils   xmllint for the libvirt walk-through (libvirt itself: below)
#   systemd         systemd-analyze verify/security and systemd-socket-activate
#                   for the unit in contrib/ (PID 1 need not be systemd)
#   man-db zsh      the generated manual page (man ./vunet.1) and zsh completion
TEST_PACKAGES=(
	"${DEMO_PACKAGES[@]}"
	gcc libc6-dev
	iproute2:ip kmod cpio udhcpc iperf3
	dpdk-dev:dpdk-testpmd
	tshark:tshark
	prometheus:promtool
	libxml2-utils:xmllint
	systemd:systemd-analyze
	man-db:man zsh
)

# What `make test` needs at a minimum version, PKG>=VERSION: libvirt's QEMU
# driver runs passt from 11.1 on for vhost-user interfaces. On bookworm
# these come from BACKPORTS.
TEST_VERSIONED=("libvirt-daemon-system>=11.1" "libvirt-clients>=11.1")
BACKPORTS=bookworm-backports
BACKPORTS_LINE="deb http://deb.debian.org/debian $BACKPORTS main"

die() {
	printf 'vunet setup: %s\n' "$*" >&2
	exit 1
}

usage() {
	printf 'usage: %s demo|test\n' "$0" >&2
	exit 64
}

[[ $# -eq 1 ]] || usage
versioned=()
case $1 in
demo) wanted=("${DEMO_PACKAGES[@]}") ;;
test) wanted=("${TEST_PACKAGES[@]}") versioned=("${TEST_VERSIONED[@]}") ;;
*) usage ;;
esac
sysroot=${VUNET_SETUP_ROOT:-}
target=$1

# The checkout: two levels above this script (no dirname: builtins only).
here=${BASH_SOURCE[0]%/*}
[[ $here == "${BASH_SOURCE[0]}" ]] && here=.
root=$(cd "$here/../.." && pwd)

# go.mod's `go` line: the oldest toolchain that builds the module.
need_go=
while read -r key value _; do
	if [[ $key == go ]]; then
		need_go=$value
		break
	fi
done <"$root/go.mod"
[[ -n $need_go ]] || die "no go line in $root/go.mod"

# version_ge A B: A >= B for dotted versions (1.26.0, 1.26, 1.26rc1).
version_ge() {
	local -a a b
	local i x y
	IFS=. read -r -a a <<<"$1"
	IFS=. read -r -a b <<<"$2"
	for i in 0 1 2; do
		x=${a[i]:-0} y=${b[i]:-0}
		x=${x%%[!0-9]*} y=${y%%[!0-9]*}
		x=${x:-0} y=${y:-0}
		((10#$x > 10#$y)) && return 0
		((10#$x < 10#$y)) && return 1
	done
	return 0
}

go_hint="install Go $need_go or newer from https://go.dev/dl/ (e.g. into /usr/local/go) and put its bin directory first on PATH; Debian 12's golang package (1.19) is too old"
gotool=${GO:-go}
if ! command -v "$gotool" >/dev/null 2>&1; then
	extra=
	[[ -x /usr/local/go/bin/go ]] && extra=" (/usr/local/go/bin/go exists: export PATH=/usr/local/go/bin:\$PATH)"
	# sudo resets PATH to its secure_path, so Go on the user's PATH is lost.
	[[ -n ${SUDO_USER:-} ]] && extra=" (sudo resets PATH: keep yours with sudo env PATH=\"\$PATH\" make $target)"
	die "'$gotool' not found on PATH$extra: $go_hint"
fi
# Run in the module so that a Go ≥ 1.21 reports the toolchain it would
# switch to (GOTOOLCHAIN) rather than itself.
if ! out=$(cd "$root" && "$gotool" version 2>&1); then
	die "'$gotool version' failed: ${out//$'\n'/ }; $go_hint"
fi
# "go version go1.26.8 linux/amd64", "go version devel go1.27-abcdef …"
have_go=
for word in $out; do
	if [[ $word == go[0-9]* ]]; then
		have_go=${word#go}
		break
	fi
done
[[ -n $have_go ]] || die "cannot read a version from '$gotool version': $out; $go_hint"
if ! version_ge "$have_go" "$need_go"; then
	die "$gotool is Go $have_go, but go.mod needs Go $need_go or newer: $go_hint"
fi

if [[ ${VUNET_SKIP_SETUP:-} == 1 ]]; then
	printf 'vunet setup: Go %s; package check skipped (VUNET_SKIP_SETUP=1)\n' "$have_go"
	exit 0
fi

command -v dpkg-query >/dev/null 2>&1 ||
	die "dpkg-query not found: this check knows Debian 12's packages; install the equivalents of: ${wanted[*]%%:*} (or set VUNET_SKIP_SETUP=1)"

pkgs=()
declare -A cmd_of=() min_of=()
for entry in "${wanted[@]}"; do
	pkg=${entry%%:*}
	pkgs+=("$pkg")
	[[ $entry == *:* ]] && cmd_of[$pkg]=${entry#*:}
done
for entry in "${versioned[@]}"; do
	pkg=${entry%%>=*}
	pkgs+=("$pkg")
	min_of[$pkg]=${entry#*>=}
done

# One query for all of them; a package dpkg has never heard of is simply
# missing from the output (and named on stderr, which is not our news).
declare -A installed=() version_of=()
while read -r pkg status version; do
	[[ $status == installed ]] || continue
	installed[${pkg%%:*}]=1
	version_of[${pkg%%:*}]=$version
done < <(dpkg-query -W -f='${Package} ${db:Status-Status} ${Version}\n' "${pkgs[@]}" 2>/dev/null || true)

missing=() old=()
for pkg in "${pkgs[@]}"; do
	if [[ -n ${min_of[$pkg]:-} ]]; then
		version=${version_of[$pkg]:-0}
		version=${version#*:} # the epoch
		if [[ -z ${installed[$pkg]:-} ]] || ! version_ge "$version" "${min_of[$pkg]}"; then
			old+=("$pkg")
		fi
		continue
	fi
	[[ -n ${installed[$pkg]:-} ]] && continue
	cmd=${cmd_of[$pkg]:-}
	[[ -n $cmd ]] && command -v "$cmd" >/dev/null 2>&1 && continue
	missing+=("$pkg")
done

need=("${missing[@]}" "${old[@]}")
if [[ ${#need[@]} -eq 0 ]]; then
	printf 'vunet setup: Go %s and every package `make %s` needs are installed\n' "$have_go" "$target"
	exit 0
fi

# The release's code name, from os-release (VERSION_CODENAME=bookworm).
codename=
if [[ -r $sysroot/etc/os-release ]]; then
	while IFS='=' read -r key value; do
		[[ $key == VERSION_CODENAME ]] && codename=${value//\"/}
	done <"$sysroot/etc/os-release"
fi

# has_backports: an apt source names $BACKPORTS (one-line or deb822 format,
# not commented out).
has_backports() {
	local f line
	for f in "$sysroot/etc/apt/sources.list" "$sysroot"/etc/apt/sources.list.d/*.list "$sysroot"/etc/apt/sources.list.d/*.sources; do
		[[ -r $f ]] || continue
		while read -r line; do
			[[ $line == \#* ]] && continue
			[[ " $line " == *" $BACKPORTS "* ]] && return 0
		done <"$f"
	done
	return 1
}

# The commands, in order: the other packages first, then the versioned
# ones (from backports on bookworm: -t only for them, so that nothing else
# comes from there).
source_file=$sysroot/etc/apt/sources.list.d/vunet-$BACKPORTS.list
add_source=
install=() install_versioned=()
[[ ${#missing[@]} -gt 0 ]] && install=(apt-get install -y -q --no-install-recommends "${missing[@]}")
if [[ ${#old[@]} -gt 0 ]]; then
	install_versioned=(apt-get install -y -q --no-install-recommends "${old[@]}")
	if [[ $codename == bookworm ]]; then
		install_versioned=(apt-get install -y -q --no-install-recommends -t "$BACKPORTS" "${old[@]}")
		has_backports || add_source=1
	fi
fi

if [[ $(id -u) != 0 ]]; then
	printf 'vunet setup: `make %s` needs Debian packages that are missing: %s\n' "$target" "${need[*]}" >&2
	printf 'vunet setup: install them as root with:\n' >&2
	# One line to paste into a root shell, whatever it has to do.
	steps=()
	[[ ${#install[@]} -gt 0 ]] && steps+=("${install[*]}")
	if [[ ${#install_versioned[@]} -gt 0 ]]; then
		[[ -n $add_source ]] && steps+=("echo '$BACKPORTS_LINE' >${source_file#"$sysroot"}" "apt-get update -q")
		steps+=("${install_versioned[*]}")
	fi
	line=${steps[0]}
	for step in "${steps[@]:1}"; do
		line+=" && $step"
	done
	printf '%s\n' "$line"
	exit 2
fi

printf 'vunet setup: installing %s\n' "${need[*]}"
export DEBIAN_FRONTEND=noninteractive
for pkg in "${missing[@]}"; do
	if [[ $pkg == tshark ]] && command -v debconf-set-selections >/dev/null 2>&1; then
		# tshark asks whether non-root users may capture; no is fine.
		echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections || true
	fi
done
if [[ -n $add_source ]]; then
	printf 'vunet setup: adding %s (%s)\n' "$BACKPORTS" "${source_file#"$sysroot"}"
	printf '%s\n' "$BACKPORTS_LINE" >"$source_file"
fi
# A freshly booted machine often has apt busy already (apt-daily refreshing
# the lists, unattended-upgrades): the installs wait for dpkg's lock rather
# than failing at once. apt-get update does not wait for the lists' lock
# (apt 2.6, Debian 12's, ignores the timeout there; a later one may not),
# so an update that fails only warns and the installs use the lists the
# machine has, unless the source just added needs that update.
lock_wait=(-o DPkg::Lock::Timeout=300)
if ! apt-get "${lock_wait[@]}" update -q; then
	[[ -z $add_source ]] || die "apt-get update failed (see above), and the $BACKPORTS source just added needs it: run this again once apt is free"
	printf 'vunet setup: apt-get update failed (see above); installing from the package lists this machine has\n' >&2
fi
[[ ${#install[@]} -eq 0 ]] || apt-get "${lock_wait[@]}" "${install[@]:1}"
[[ ${#install_versioned[@]} -eq 0 ]] || apt-get "${lock_wait[@]}" "${install_versioned[@]:1}"
