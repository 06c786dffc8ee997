// Package initramfs builds the boot image for QEMU end-to-end tests: the
// host's kernel, and a gzip'd cpio (newc) initramfs holding busybox-static
// with its applet links, the virtio-net modules of that kernel, a small /init
// script and the test agent (vunet/test/guest/agent, built with
// CGO_ENABLED=0).
//
// Images are cached twice: Build writes them under a directory keyed by a hash
// of every input, so reruns reuse them, and callers keep one Image per test
// binary (sync.Once). It is test infrastructure: it may shell out to go, xz
// and zstd, and must not import the daemon's packages.
package initramfs
