package main

import (
	"fmt"
	"net"
)

// sdNotify sends one systemd notification (sd_notify(3)) to the datagram
// socket systemd named in NOTIFY_SOCKET (a leading '@', the abstract
// namespace, is understood by package net as well).
func sdNotify(socket, state string) error {
	addr := &net.UnixAddr{Name: socket, Net: "unixgram"}
	c, err := net.DialUnix("unixgram", nil, addr)
	if err != nil {
		return fmt.Errorf("sd_notify %s: %w", socket, err)
	}
	defer c.Close()
	if _, err := c.Write([]byte(state)); err != nil {
		return fmt.Errorf("sd_notify %s: %w", socket, err)
	}
	return nil
}
