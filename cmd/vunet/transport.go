package main

import (
	"errors"
	"fmt"
)

// What the front-end speaks on the socket. vhost-user hands vunet the
// guest's memory and rings; the stream transport (QEMU's -netdev stream,
// what passt serves without --vhost-user) carries the frames themselves,
// each behind its 32-bit big-endian length. The translation behind both is
// the same (tcpstack.Stack.ServeStream).

// resolveTransport settles the transport: as given (the last of
// --transport and --vhost-user), else passt's rule: a binary invoked as
// passt serves the stream protocol unless told --vhost-user, vunet serves
// vhost-user. It rejects what the stream transport cannot do.
func (o *options) resolveTransport(p program) error {
	if o.transport == "" {
		o.transport = transportVhostUser
		if p.passt {
			o.transport = transportStream
		}
	}
	if o.transport != transportStream {
		return nil
	}
	switch {
	case o.connect != "":
		return errors.New("--connect: the stream transport serves a socket (--socket) or a connected descriptor (--fd), and QEMU's -netdev stream connects to it (server=off)")
	case o.queues != 1:
		return fmt.Errorf("--queues %d: the stream transport carries one queue", o.queues)
	case o.migrateTo != "" || o.migrateFrom != "" || o.repairPath != "":
		return errors.New("--migrate-to, --migrate-from and --repair-path need the vhost-user transport (live migration hands over vhost-user rings)")
	}
	return nil
}

// streamQEMUArgs returns QEMU's arguments for the stream transport as
// flag/value pairs: -netdev stream dialling the socket (reconnect= from
// QEMU 8.0, reconnect-ms= from 9.2) and the NIC. No shared memory is
// needed: QEMU moves the frames itself.
func streamQEMUArgs(hc helperConfig) []string {
	netdev := "stream,id=" + hc.id + ",server=off,addr.type=unix,addr.path=" + qemuEscape(hc.socket)
	switch {
	case hc.qemu.reconnectMS():
		netdev += ",reconnect-ms=1000"
	case hc.qemu.atLeast(8, 0):
		netdev += ",reconnect=1"
	}
	device := "virtio-net-pci,netdev=" + hc.id
	if hc.mac != "" {
		device += ",mac=" + hc.mac
	}
	return []string{"-m", hc.mem, "-netdev", netdev, "-device", device}
}
