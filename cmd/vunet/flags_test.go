package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestParseFlags(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		wantErr string
		check   func(*testing.T, *options)
	}{
		{name: "long socket", args: []string{"--socket", "/tmp/a.sock"}, check: func(t *testing.T, o *options) {
			if o.socket != "/tmp/a.sock" || o.socketMode != 0o600 || o.queues != 1 || o.oneOff {
				t.Errorf("got %+v", o)
			}
		}},
		{name: "passt spellings", args: []string{"--vhost-user", "-s", "/tmp/b.sock", "-1", "-d"}, check: func(t *testing.T, o *options) {
			if o.socket != "/tmp/b.sock" || !o.oneOff || !o.debug {
				t.Errorf("got %+v", o)
			}
		}},
		{name: "socket mode", args: []string{"--socket", "x", "--socket-mode", "0660"}, check: func(t *testing.T, o *options) {
			if o.socketMode != 0o660 {
				t.Errorf("mode %o", o.socketMode)
			}
		}},
		{name: "connect queues", args: []string{"--connect", "/run/q.sock", "--queues", "4"}, check: func(t *testing.T, o *options) {
			if o.connect != "/run/q.sock" || o.queues != 4 {
				t.Errorf("got %+v", o)
			}
		}},
		{name: "fd", args: []string{"-F", "3"}, check: func(t *testing.T, o *options) {
			if o.fd != 3 {
				t.Errorf("fd %d", o.fd)
			}
		}},
		{name: "version needs no socket", args: []string{"--version"}},
		{name: "capabilities need no socket", args: []string{"--print-capabilities"}},
		{name: "no socket", args: nil, wantErr: "is required"},
		{name: "two modes", args: []string{"-s", "a", "--connect", "b"}, wantErr: "exclude each other"},
		{name: "bad mode", args: []string{"-s", "a", "--socket-mode", "999"}, wantErr: "octal"},
		{name: "zero queues", args: []string{"-s", "a", "--queues", "0"}, wantErr: "--queues 0"},
		{name: "unknown flag", args: []string{"-s", "a", "--bogus"}, wantErr: "bogus"},
		{name: "stray argument", args: []string{"-s", "a", "extra"}, wantErr: `"extra"`},
		{name: "bad log format", args: []string{"-s", "a", "--log-format", "xml"}, wantErr: "--log-format"},
		{name: "debug and quiet", args: []string{"-s", "a", "-d", "-q"}, wantErr: "exclude each other"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, err := parseFlags(tt.args, &bytes.Buffer{})
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tt.check != nil {
				tt.check(t, o)
			}
		})
	}
}

func TestRunExitCodes(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"--print-capabilities"}, &out, &errb); code != 0 || strings.TrimSpace(out.String()) != `{"type": "net"}` {
		t.Fatalf("print-capabilities: code %d out %q", code, out.String())
	}
	out.Reset()
	if code := run([]string{"--bogus-flag"}, &out, &errb); code != 1 || !strings.Contains(errb.String(), "bogus-flag") {
		t.Fatalf("bad flag: code %d stderr %q", code, errb.String())
	}
	errb.Reset()
	if code := run([]string{"--help"}, &out, &errb); code != 0 || !strings.Contains(errb.String(), "--socket") || !strings.Contains(errb.String(), "--socket, -s PATH") {
		t.Fatalf("help: code %d stderr %q", code, errb.String())
	}
}
