package main

import (
	"path/filepath"
	"strings"
)

// program is how the binary was invoked. Installed as passt (a symlink
// named passt, or passt.avx2 as Debian ships it, first in a management
// stack's PATH), vunet takes passt's start-up semantics: it goes to the
// background once serving, which libvirt and QEMU wait for.
type program struct {
	name  string // base name of argv[0], for messages and syslog
	passt bool
}

// programOf classifies argv[0] as passt does (conf_mode: the base name
// contains "passt").
func programOf(argv0 string) program {
	base := filepath.Base(argv0)
	return program{name: base, passt: strings.Contains(base, "passt")}
}

// notifySocketEnv is set by systemd for Type=notify services (and for
// others only with NotifyAccess=).
const notifySocketEnv = "NOTIFY_SOCKET"

// startsInBackground reports whether the process should hand over to a
// background daemon once serving (passt without -f), rather than serve
// in the foreground (vunet's default).
//
// passt's rule applies to a binary invoked as passt and to any invocation
// with --vhost-user: those are the command lines libvirt and QEMU build,
// and both wait for the command to exit. -f keeps the foreground, and so
// does NOTIFY_SOCKET: the service manager asked to be told when the
// process it started is ready, and vunet tells it (sd_notify READY=1), so
// that process must stay. INVOCATION_ID alone decides nothing: systemd
// sets it for every unit, including Type=forking units written for passt
// that expect it to fork.
func startsInBackground(p program, o *options, getenv func(string) string) bool {
	if o.foreground || getenv(notifySocketEnv) != "" {
		return false
	}
	return p.passt || o.vhostUser
}
