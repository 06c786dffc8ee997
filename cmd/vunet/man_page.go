package main

import (
	"fmt"
	"io"
	"strings"

	"vunet/metrics"
)

// writeManPage writes vunet(1) in man(7) roff, from the same flag
// definitions as --help: `vunet man > vunet.1` (make man), `man ./vunet.1`.
func writeManPage(w io.Writer, b metrics.BuildInfo) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	text := func(s string) { p("%s", roffText(s)) }

	p(`.TH VUNET 1 "" "vunet %s" "User Commands"`, roffText(b.Version))
	p(".SH NAME")
	p(`vunet \- vhost\-user network back\-end that translates guest frames to host sockets`)
	p(".SH SYNOPSIS")
	for _, syn := range []string{"--socket PATH [options]", "--connect PATH [options]", "--fd FD [options]",
		"qemu-args --socket PATH [options]", "libvirt-xml --socket PATH [options]",
		"ctl --control PATH [--json] list|status", "ctl --control PATH [--json] add -t|-u SPEC ...",
		"ctl --control PATH [--json] remove -t|-u SPEC|ID ...", "man", "completion bash|zsh"} {
		p(".br")
		p(`\fBvunet\fR %s`, roffText(syn))
	}
	p(".SH DESCRIPTION")
	text("vunet is a vhost-user network back-end. QEMU, or any vhost-user front-end (libvirt, DPDK virtio-user, cloud-hypervisor), connects to its UNIX socket and hands it the guest's memory and virtqueues; vunet moves the guest's Ethernet frames to and from native host sockets: a guest TCP connection becomes a host connect()ed TCP socket, a UDP flow a connected host UDP socket, a ping a host ping socket. The host kernel does congestion control, retransmission and buffering; the guest needs no tap device and vunet no privileges.")
	p(".PP")
	text("The guest gets the host's own address, prefix and gateway by DHCP, DHCPv6 and NDP, MTU 65520; its connections to the gateway address reach the host's loopback; --tcp-ports and --udp-ports forward host ports to the guest. passt's options and start-up behaviour are accepted, so vunet can stand where passt's vhost-user mode is started.")
	p(".SH OPTIONS")
	group := ""
	for _, d := range daemonFlagDocs() {
		if d.group != group {
			group = d.group
			p(".SS %s", roffText(group))
		}
		manEntry(p, d)
	}
	p(".SH COMMANDS")
	for _, hc := range helperCommands {
		p(".SS %s", roffText("vunet "+hc.name))
		text(hc.does + ". It takes the daemon's options (the command line that starts vunet can be reused; --socket, --connect, --queues and --guest-mac count) and these:")
		for _, d := range helperFlagDocs(hc.name) {
			manEntry(p, d)
		}
	}
	p(".SS vunet ctl")
	text("talk to a running daemon's control endpoint (its --control PATH): change the forwarded ports without a restart, or read its status. Each -t or -u SPEC (and each ID) is one request, in order; the first refused one stops, and the exit status is 1. Options:")
	for _, d := range ctlFlagDocs() {
		manEntry(p, d)
	}
	p(".PP")
	text("Commands:")
	for _, c := range ctlCommands {
		p(".TP")
		p(`\fB%s\fR %s`, roffText(c.name), roffText(c.args))
		text(c.does + ".")
	}
	p(".SS vunet man")
	text("print this manual page (roff).")
	p(".SS vunet completion bash|zsh")
	text("print a completion script for the shell: bash (source it, or install it as /usr/share/bash-completion/completions/vunet) or zsh (install it as _vunet in a directory of $fpath).")
	p(".SH CONTROL")
	text("With --control PATH the daemon serves JSON over HTTP on that UNIX socket, created at start-up with mode 0600 (--control-mode) and removed at exit: whoever may connect to the file may change the forwards, so its permissions are the authentication. GET /v1/forwards lists the forwarded ports; POST /v1/forwards with {\"protocol\": \"tcp\", \"spec\": \"8080:80\"} adds some; DELETE /v1/forwards with the same body, or DELETE /v1/forwards/ID, removes some; GET /v1/status reports the guest and its flows. A refused request gets {\"error\": \"...\"} and a status: 400 a bad spec, 403 a port below net.ipv4.ip_unprivileged_port_start once privileges are dropped, 404 no such forward, 409 an overlap with an open forward or a port in use, 503 out of descriptors.")
	p(".SH SIGNALS")
	text("SIGTERM and SIGINT close the front-end connection, reset open host TCP connections (their peers learn at once), remove the socket (unless systemd passed it) and the pid file, and exit 0 within 2 seconds.")
	p(".SH ENVIRONMENT")
	p(".TP")
	p(`\fBNOTIFY_SOCKET\fR`)
	text("set by systemd for Type=notify services: vunet stays in the foreground and sends READY=1 and MAINPID there once it serves.")
	p(".TP")
	p(`\fBLISTEN_PID\fR, \fBLISTEN_FDS\fR`)
	text("socket activation: the listening socket is descriptor 3; vunet serves it instead of creating the --socket path, which must name the same socket.")
	p(".SH EXIT STATUS")
	text("0 after a signal or, with --one-off, once the front-end has left; 1 on a usage error or a failure to start or serve, with one line on standard error that names the cause.")
	p(".SH SEE ALSO")
	p(`\fBqemu\-system\-x86_64\fR(1), \fBpasst\fR(1), \fBvirsh\fR(1), \fBsystemd.socket\fR(5), \fBsystemd\-socket\-activate\fR(1)`)
}

// manEntry writes one option as a tagged paragraph.
func manEntry(p func(string, ...any), d flagDoc) {
	var tag []string
	for _, s := range d.spelled() {
		tag = append(tag, `\fB`+roffText(s)+`\fR`)
	}
	line := strings.Join(tag, ", ")
	if d.arg != "" {
		line += ` \fI` + roffText(d.arg) + `\fR`
	}
	p(".TP")
	p("%s", line)
	p("%s", roffText(d.help))
}

// roffText escapes text for a roff text line: backslashes, and hyphens as
// \- so that option names render as ASCII minus signs users can paste; a
// leading . or ' would start a request.
func roffText(s string) string {
	s = strings.ReplaceAll(s, `\`, `\e`)
	s = strings.ReplaceAll(s, "-", `\-`)
	if strings.HasPrefix(s, ".") || strings.HasPrefix(s, "'") {
		s = `\&` + s
	}
	return s
}
