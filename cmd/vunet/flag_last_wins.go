package main

import (
	"fmt"
	"strconv"
)

// Options that contradict each other follow passt's rule: the one given
// last wins, as in passt's getopt loop. Management stacks depend on it:
// QEMU's -netdev passt passes --quiet first and appends the user's
// param=--debug after it. Each value below applies its whole effect when
// the flag package calls Set, in command-line order.

// levelValue is -d, -q, --trace and --log-level: each sets the log level,
// and the last one given decides.
type levelValue struct {
	o     *options
	level string // the level a switch sets; "" for --log-level LEVEL
	trace bool
}

func (v levelValue) IsBoolFlag() bool { return v.level != "" }

func (v levelValue) String() string {
	if v.o == nil {
		return ""
	}
	if v.level != "" {
		return strconv.FormatBool(v.o.logLevel == v.level)
	}
	return v.o.logLevel
}

func (v levelValue) Set(s string) error {
	if v.level == "" {
		if _, err := parseLevel(s); err != nil {
			return fmt.Errorf("want debug, info, warn or error")
		}
		v.o.logLevel, v.o.trace = s, false
		return nil
	}
	on, err := strconv.ParseBool(s)
	if err != nil {
		return fmt.Errorf("want true or false")
	}
	if on {
		v.o.logLevel, v.o.trace = v.level, v.trace
	}
	return nil
}

// familyOnly is -4 and -6: the later one wins (passt: "v4_only = true;
// v6_only = false" and the converse).
type familyOnly struct {
	o  *options
	v6 bool
}

func (f familyOnly) IsBoolFlag() bool { return true }

func (f familyOnly) String() string {
	if f.o == nil {
		return "false"
	}
	return strconv.FormatBool(f.v6 && f.o.only6 || !f.v6 && f.o.only4)
}

func (f familyOnly) Set(s string) error {
	on, err := strconv.ParseBool(s)
	if err != nil {
		return fmt.Errorf("want true or false")
	}
	if !on {
		return nil
	}
	f.o.only4, f.o.only6 = !f.v6, f.v6
	return nil
}

// endpoint names where the front-end is: --socket, --connect or --fd. The
// last one given wins (passt: -s clears the --fd, -F clears the socket).
type endpoint int

const (
	endpointSocket endpoint = iota
	endpointConnect
	endpointFD
)

// endpointValue sets one endpoint and clears the others.
type endpointValue struct {
	o    *options
	kind endpoint
}

func (e endpointValue) String() string {
	if e.o == nil {
		return ""
	}
	switch e.kind {
	case endpointSocket:
		return e.o.socket
	case endpointConnect:
		return e.o.connect
	}
	if e.o.fd < 0 {
		return ""
	}
	return strconv.Itoa(e.o.fd)
}

func (e endpointValue) Set(s string) error {
	o := e.o
	switch e.kind {
	case endpointSocket, endpointConnect:
		if s == "" {
			return fmt.Errorf("empty path")
		}
		o.socket, o.connect, o.fd = "", "", -1
		if e.kind == endpointSocket {
			o.socket = s
		} else {
			o.connect = s
		}
	case endpointFD:
		n, err := strconv.ParseInt(s, 0, 32)
		// passt refuses standard output and error; standard input may be
		// the socket (started by inetd or a socket-activating manager).
		if err != nil || n < 0 || n == 1 || n == 2 {
			return fmt.Errorf("want a file descriptor number other than 1 and 2")
		}
		o.socket, o.connect, o.fd = "", "", int(n)
		o.oneOff = true // passt: --fd implies --one-off, and stays so
	}
	return nil
}

// Transports: the protocol spoken on the socket.
const (
	transportVhostUser = "vhost-user"
	transportStream    = "stream"
)

// vhostUserFlag is --vhost-user: passt's vhost-user mode, the vhost-user
// transport. Against --transport, the later one wins.
type vhostUserFlag struct{ o *options }

func (v vhostUserFlag) IsBoolFlag() bool { return true }

func (v vhostUserFlag) String() string {
	if v.o == nil {
		return "false"
	}
	return strconv.FormatBool(v.o.vhostUser)
}

func (v vhostUserFlag) Set(s string) error {
	on, err := strconv.ParseBool(s)
	if err != nil {
		return fmt.Errorf("want true or false")
	}
	v.o.vhostUser = on
	if on {
		v.o.transport = transportVhostUser
	}
	return nil
}

// transportValue is --transport MODE; the last of it and --vhost-user wins.
type transportValue struct{ o *options }

func (v transportValue) String() string {
	if v.o == nil {
		return ""
	}
	return v.o.transport
}

func (v transportValue) Set(s string) error {
	switch s {
	case transportVhostUser, transportStream:
		v.o.transport = s
		return nil
	}
	return fmt.Errorf("want vhost-user or stream")
}
