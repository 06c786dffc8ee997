// Command agent is the test agent that runs inside a QEMU guest as PID 1
// (exec'd by the initramfs's /init after the virtio modules are loaded).
//
// It reads the checks to run from the kernel command line (see package
// vunet/test/guest for the parameter names), runs them one after the other
// against eth0, prints one guest.Result line per check on the console (and on
// the port named by vunet.results, if any), then powers the guest off so that
// QEMU exits. Started under the name of the DHCP hook (a symlink in the
// initramfs), it acts as udhcpc's event script instead.
//
// It must build with CGO_ENABLED=0 and stay self-contained: the initramfs
// holds nothing but busybox, a few kernel modules and this binary. It must not
// import the daemon's packages; the guest only speaks Ethernet to the daemon.
package main
