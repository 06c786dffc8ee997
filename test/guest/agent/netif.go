package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

const ifName = "eth0"

func sysNet(iface, file string) (string, error) {
	b, err := os.ReadFile("/sys/class/net/" + iface + "/" + file)
	return strings.TrimSpace(string(b)), err
}

// sysNetUint reads a sysfs counter of iface.
func sysNetUint(iface, file string) (uint64, error) {
	s, err := sysNet(iface, file)
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(s, 10, 64)
}

func statCounter(iface, name string) uint64 {
	n, _ := sysNetUint(iface, "statistics/"+name)
	return n
}

// waitFor polls cond until it holds or ctx ends; the guest has no event
// source worth wiring up for a handful of sysfs files.
func waitFor(ctx context.Context, what string, cond func() bool) error {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case <-t.C:
		}
	}
	return nil
}

func setUp(iface string) error { return setFlagUp(iface, true) }

// setFlagUp sets or clears iface's IFF_UP.
func setFlagUp(iface string, up bool) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("socket for ioctl: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq(iface)
	if err != nil {
		return fmt.Errorf("ifreq %s: %w", iface, err)
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("get flags of %s: %w", iface, err)
	}
	flags := ifr.Uint16() &^ unix.IFF_UP
	if up {
		flags |= unix.IFF_UP
	}
	ifr.SetUint16(flags)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("set %s up=%v: %w", iface, up, err)
	}
	return nil
}

// ifaceIPv4 returns eth0's first IPv4 address, or the zero address before
// DHCP (ARP then goes out as a probe, which a responder must still answer).
func ifaceIPv4(iface string) net.IP {
	ifi, err := net.InterfaceByName(iface)
	if err != nil {
		return net.IPv4zero.To4()
	}
	addrs, _ := ifi.Addrs()
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil {
			return n.IP.To4()
		}
	}
	return net.IPv4zero.To4()
}
