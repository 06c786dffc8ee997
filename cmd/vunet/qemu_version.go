package main

import (
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"time"
)

// qemuVersion is a QEMU release, major.minor.
type qemuVersion struct{ major, minor int }

func (v qemuVersion) String() string { return fmt.Sprintf("%d.%d", v.major, v.minor) }

func (v qemuVersion) atLeast(major, minor int) bool {
	return v.major > major || v.major == major && v.minor >= minor
}

// reconnectMS reports whether the chardev's reconnect interval is spelled
// reconnect-ms= (QEMU 9.2 added it and deprecated reconnect=, which 10.2
// removed; QEMU 7.2 knows only reconnect=).
func (v qemuVersion) reconnectMS() bool { return v.atLeast(9, 2) }

var (
	qemuVersionLine = regexp.MustCompile(`QEMU emulator version (\d+)\.(\d+)`)
	qemuVersionArg  = regexp.MustCompile(`^(\d+)\.(\d+)(\.\d+)?$`)
)

// parseQEMUVersion reads the release from `qemu-system-x86_64 --version`
// ("QEMU emulator version 7.2.19 (Debian 1:7.2+dfsg-7+deb12u18)").
func parseQEMUVersion(out string) (qemuVersion, error) {
	m := qemuVersionLine.FindStringSubmatch(out)
	if m == nil {
		return qemuVersion{}, fmt.Errorf("no \"QEMU emulator version\" in %q", firstLine(out))
	}
	return versionFromMatch(m)
}

// parseVersionArg reads --qemu-version's MAJOR.MINOR[.MICRO].
func parseVersionArg(s string) (qemuVersion, error) {
	m := qemuVersionArg.FindStringSubmatch(s)
	if m == nil {
		return qemuVersion{}, fmt.Errorf("want MAJOR.MINOR, such as 7.2 or 10.1")
	}
	return versionFromMatch(m)
}

func versionFromMatch(m []string) (qemuVersion, error) {
	major, err1 := strconv.Atoi(m[1])
	minor, err2 := strconv.Atoi(m[2])
	if err1 != nil || err2 != nil || major > 1000 || minor > 1000 {
		return qemuVersion{}, fmt.Errorf("version %s.%s out of range", m[1], m[2])
	}
	return qemuVersion{major, minor}, nil
}

func firstLine(s string) string {
	for i := 0; i < len(s); i++ {
		if s[i] == '\n' {
			return s[:i]
		}
	}
	return s
}

// qemuBinary is the QEMU whose version decides the helpers' spelling.
const qemuBinary = "qemu-system-x86_64"

// detectQEMUVersion runs qemuBinary --version; replaceable in tests, which
// must not depend on the machine's QEMU.
var detectQEMUVersion = func() (qemuVersion, error) {
	path, err := exec.LookPath(qemuBinary)
	if err != nil {
		return qemuVersion{}, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, "--version").Output()
	if err != nil {
		return qemuVersion{}, fmt.Errorf("%s --version: %w", path, err)
	}
	return parseQEMUVersion(string(out))
}

// fallbackQEMU is assumed when no QEMU can be asked: Debian 12's 7.2, the
// release this project is tested on (reconnect=).
var fallbackQEMU = qemuVersion{7, 2}
