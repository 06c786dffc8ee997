// Package callers rebuilds, argument for argument, the command lines with
// which management stacks start passt, so tests can run vunet exactly as
// they would:
//
//   - libvirt 9.0.0 (upstream; Debian 12 ships it with passt disabled by
//     its patch Disable-passt-support), src/qemu/qemu_passt.c
//     qemuPasstStart: <interface type='user'><backend type='passt'/>, QEMU
//     -netdev stream (qemuPasstAddNetProps: Libvirt90Netdev); libvirt daemonizes the command itself and keeps its
//     own pid file.
//   - libvirt 11.3.0 (Debian 13), the same function with --vhost-user for
//     <interface type='vhostuser'><backend type='passt'/> (since 11.1.0)
//     and --pid instead of libvirt's pid file; libvirt waits for the
//     command to exit.
//   - libvirt master (2025), qemuPasstBuildCommand: as 11.3.0 plus
//     --hostname and --fqdn.
//   - QEMU 10.1 -netdev passt, net/passt.c net_passt_decode_args (the
//     option set is unchanged in 10.2.2): QEMU creates a socket pair,
//     hands one end to passt as descriptor 3 (--fd 3), waits for the
//     command to exit, then reads the pid file it passed with --pid.
//
// The builders mirror the C sources' order and conditions; the field
// comments name the XML element or QEMU property each comes from. Launch
// runs a command line as those callers do: wait for the exit, read the
// pid file.
//
// The package is test code: nothing outside test/ and the tests of cmd/vunet
// may import it.
package callers
