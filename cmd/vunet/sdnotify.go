package main

import (
	"fmt"
	"net"
)

// sdNotify sends one systemd notification (sd_notify(3)) to the datagram
// socket systemd named in NOTIFY_SOCKET (a leading '@', the abstract
// namespace, is understood by package net as well).
func sdNotify(socket, state string) error {
	c, err := sdNotifyDial(socket)
	if err != nil {
		return err
	}
	return sdNotifyConn(c, socket, state)
}

// sdNotifyDial connects to NOTIFY_SOCKET; a sandboxed daemon does so
// before the sandbox, which allows no UNIX socket later.
func sdNotifyDial(socket string) (*net.UnixConn, error) {
	c, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: socket, Net: "unixgram"})
	if err != nil {
		return nil, fmt.Errorf("sd_notify %s: %w", socket, err)
	}
	return c, nil
}

// sdNotifyConn sends state on a connection from sdNotifyDial and closes it.
func sdNotifyConn(c *net.UnixConn, socket, state string) error {
	defer c.Close()
	if _, err := c.Write([]byte(state)); err != nil {
		return fmt.Errorf("sd_notify %s: %w", socket, err)
	}
	return nil
}
