package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"vunet/test/guest"
)

// dhcpHookName is the name under which udhcpc runs this binary as its event
// script; the initramfs builder creates the symlink.
const dhcpHookName = "vunet-dhcp-hook"

func main() {
	if filepath.Base(os.Args[0]) == dhcpHookName {
		os.Exit(runDHCPHook(os.Args[1:]))
	}
	a := newAgent()
	a.run()
	if d, err := time.ParseDuration(a.params.Values[guest.ParamHold]); err == nil && d > 0 && d < time.Hour {
		time.Sleep(d)
	}
	powerOff()
}

// agent carries state from one check to the next (the DHCP lease feeds the
// ARP and ping checks' default targets).
type agent struct {
	params guest.Params
	out    []*os.File
	lease  map[string]string // udhcpc environment of the last bound/renew event
}

func newAgent() *agent {
	a := &agent{out: []*os.File{os.Stdout}}
	raw, err := os.ReadFile("/proc/cmdline")
	if err != nil {
		a.report(guest.Result{Name: guest.ResultBoot, Fields: map[string]string{"detail": "read /proc/cmdline: " + err.Error()}})
		return a
	}
	a.params, err = guest.ParseCmdline(string(raw))
	if err != nil {
		a.report(guest.Result{Name: guest.ResultBoot, Fields: map[string]string{"detail": err.Error()}})
	}
	if dev := a.params.Values[guest.ParamResults]; dev != "" {
		// A dedicated serial port keeps result lines apart from kernel messages.
		if f, err := os.OpenFile(dev, os.O_WRONLY|unix.O_NOCTTY, 0); err == nil {
			a.out = append(a.out, f)
		}
	}
	return a
}

func (a *agent) run() {
	var uts unix.Utsname
	_ = unix.Uname(&uts)
	a.report(guest.Result{Name: guest.ResultBoot, OK: true, Fields: map[string]string{
		"kernel": unix.ByteSliceToString(uts.Release[:]),
		"uptime": uptime(),
		"checks": strings.Join(a.params.Checks, ","),
	}})
	failed := 0
	for _, name := range a.params.Checks {
		ctx, cancel := context.WithTimeout(context.Background(), a.params.Timeout)
		start := time.Now()
		r := a.runCheck(ctx, name)
		cancel()
		r.Name = name
		if r.Fields == nil {
			r.Fields = map[string]string{}
		}
		r.Fields["ms"] = strconv.FormatInt(time.Since(start).Milliseconds(), 10)
		a.report(r)
		if !r.OK {
			failed++
		}
	}
	a.report(guest.Result{Name: guest.ResultDone, OK: failed == 0, Fields: map[string]string{
		"checks": strconv.Itoa(len(a.params.Checks)),
		"failed": strconv.Itoa(failed),
		"uptime": uptime(),
	}})
}

func (a *agent) runCheck(ctx context.Context, name string) guest.Result {
	switch base := guest.CheckBase(name); {
	case strings.HasPrefix(base, guest.CheckXferPrefix), base == guest.CheckUDPEcho, base == guest.CheckPing:
		// These may run while the traffic moves between TX queues.
		h, err := a.newHopper()
		if err != nil {
			return fail("%v", err)
		}
		if h != nil {
			return h.during(ctx, func(ctx context.Context) guest.Result { return a.runOne(ctx, name) })
		}
	}
	return a.runOne(ctx, name)
}

func (a *agent) runOne(ctx context.Context, name string) guest.Result {
	if strings.HasPrefix(name, guest.CheckXferPrefix) {
		return a.checkXfer(ctx, guest.CheckBase(name))
	}
	switch guest.CheckBase(name) {
	case guest.CheckLink:
		return a.checkLink(ctx)
	case guest.CheckDHCP:
		return a.checkDHCP(ctx)
	case guest.CheckARP:
		return a.checkARP(ctx)
	case guest.CheckPing:
		return a.checkPing(ctx)
	case guest.CheckHTTP:
		return a.checkHTTP(ctx)
	case guest.CheckARPLoop:
		return a.checkARPLoop(ctx)
	case guest.CheckIPv6:
		return a.checkIPv6(ctx)
	case guest.CheckARPFlood:
		return a.checkARPFlood(ctx)
	case guest.CheckUDPEcho:
		return a.checkUDPEcho(ctx)
	case guest.CheckTCPMany:
		return a.checkTCPMany(ctx)
	case guest.CheckTCPLoop:
		return a.checkTCPLoop(ctx)
	case guest.CheckTCPHold:
		return a.checkTCPHold(ctx)
	case guest.CheckStreaming:
		return a.checkStreaming(ctx)
	case guest.CheckTCPServe:
		return a.checkTCPServe(ctx)
	case guest.CheckEchoServe:
		return a.checkEchoServe(ctx)
	case guest.CheckRR:
		return a.checkRR(ctx)
	case guest.CheckGone:
		return a.checkGone(ctx)
	case guest.CheckDHCPv6:
		return a.checkDHCPv6(ctx)
	case guest.CheckPolicy:
		return a.checkPolicy(ctx)
	case guest.CheckGoTest:
		return a.checkGoTest(ctx)
	}
	return fail("unknown check %q", name)
}

// report writes one result line per output with a single write, starting
// with a newline so a half-written kernel message cannot glue onto it.
func (a *agent) report(r guest.Result) {
	line := []byte("\n" + r.Format() + "\n")
	for _, f := range a.out {
		_, _ = f.Write(line)
	}
}

func fail(format string, args ...any) guest.Result {
	return guest.Result{Fields: map[string]string{"detail": fmt.Sprintf(format, args...)}}
}

func uptime() string {
	b, err := os.ReadFile("/proc/uptime")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return "?"
	}
	return f[0]
}
