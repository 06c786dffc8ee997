package main

import (
	"context"
	"os/exec"
	"regexp"
	"strconv"

	"vunet/test/guest"
)

var pingSummary = regexp.MustCompile(`(\d+) packets transmitted, (\d+) packets received`)

// checkPing uses busybox ping: it opens the raw or ping socket the way a
// user's tools would.
func (a *agent) checkPing(ctx context.Context) guest.Result {
	target := a.params.Values[guest.ParamPing]
	if target == "" {
		target = firstWord(a.lease["router"])
	}
	if target == "" {
		return fail("no ping target: set %s or run the dhcp check first", guest.ParamPing)
	}
	args := []string{"-c", "3", "-W", "3"}
	if n, err := strconv.Atoi(a.params.Values[guest.ParamPingCount]); err == nil && n > 0 {
		args = []string{"-c", strconv.Itoa(n), "-i", "0.1", "-W", "3"}
	}
	out, err := exec.CommandContext(ctx, "/bin/ping", append(args, target)...).CombinedOutput()
	r := guest.Result{Fields: map[string]string{"target": target}}
	if m := pingSummary.FindSubmatch(out); m != nil {
		r.Fields["sent"], r.Fields["received"] = string(m[1]), string(m[2])
		if n, _ := strconv.Atoi(string(m[2])); n > 0 {
			r.OK = true
		}
	}
	if err != nil {
		r.Fields["detail"] = err.Error() + ": " + lastLines(string(out), 3)
	}
	return r
}
