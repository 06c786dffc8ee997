package main

import (
	"context"
	"os/exec"
	"strconv"
	"strings"

	"vunet/test/guest"
)

// gotestDetail bounds the output tail a failed gotest check reports.
const gotestDetail = 4000

// checkGoTest runs a Go test binary from the image on this kernel (see
// guest.CheckGoTest).
func (a *agent) checkGoTest(ctx context.Context) guest.Result {
	bin, run := a.params.Values[guest.ParamGoTest], a.params.Values[guest.ParamGoTestRun]
	if bin == "" || run == "" {
		return fail("%s and %s are required", guest.ParamGoTest, guest.ParamGoTestRun)
	}
	if err := setUp("lo"); err != nil {
		return fail("loopback: %v", err)
	}
	cmd := exec.CommandContext(ctx, bin, "-test.run="+run, "-test.v", "-test.count=1")
	cmd.Dir = "/tmp"
	out, err := cmd.CombinedOutput()
	res := guest.Result{Fields: map[string]string{}}
	code := 0
	if err != nil {
		code = -1
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		}
	}
	res.Fields["exit"] = strconv.Itoa(code)
	passed := strings.Count(string(out), "--- PASS: ")
	res.Fields["passed"] = strconv.Itoa(passed)
	for _, line := range strings.Split(string(out), "\n") {
		i := strings.Index(line, guest.FieldsPrefix)
		if i < 0 {
			continue
		}
		for _, w := range strings.Fields(line[i+len(guest.FieldsPrefix):]) {
			if k, v, ok := strings.Cut(w, "="); ok && k != "name" && k != "ok" {
				res.Fields[k] = v
			}
		}
	}
	res.OK = err == nil && passed > 0
	if !res.OK {
		tail := string(out)
		if len(tail) > gotestDetail {
			tail = tail[len(tail)-gotestDetail:]
		}
		res.Fields["detail"] = tail
	}
	return res
}
