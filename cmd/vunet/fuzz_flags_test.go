package main

import (
	"bytes"
	"strings"
	"testing"
)

// FuzzParseFlags: no command line panics the parser, and every rejected
// one is reported in a single line.
func FuzzParseFlags(f *testing.F) {
	for _, s := range []string{
		"-s\x00/tmp/x", "-1fds/tmp/x\x00-t22", "--socket=/x\x00-t\x00all\x00-t\x0022",
		"-s\x00x\x00-a\x0010.0.0.1\x00-a\x00::1", "-s\x00x\x00-4\x00-6", "-F\x003",
		"-s\x00x\x00-D\x00none\x00-S\x00a.b c.d", "--", "-", "-s\x00x\x00-n\x00255.255.0.0",
		"qemu-args\x00-s\x00x", "-s\x00x\x00--map-host-loopback\x00none\x00--no-map-gw",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		args := strings.Split(s, "\x00")
		if len(args) > 64 {
			return
		}
		var out bytes.Buffer
		_, err := parseFlags(args, &out)
		if err != nil && err != errHelp && strings.Contains(err.Error(), "\n") {
			t.Fatalf("%q: multi-line error %q", args, err)
		}
	})
}
