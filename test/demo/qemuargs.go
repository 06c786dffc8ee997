package main

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
)

// qemuArgsFromVunet asks the vunet binary for the QEMU arguments that
// connect a guest to socket, as a user would (`vunet qemu-args`), so the demo
// exercises the documented way of wiring QEMU rather than a private copy.
func qemuArgsFromVunet(ctx context.Context, vunet, socket, mem, mac string) ([]string, string, error) {
	cmd := exec.CommandContext(ctx, vunet, "qemu-args", "--socket", socket, "--tcg", "--mem", mem, "--guest-mac-addr", mac)
	out, err := cmd.Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = strings.TrimSpace(string(ee.Stderr))
		}
		return nil, "", fmt.Errorf("vunet qemu-args: %w %s", err, stderr)
	}
	args, err := parseQEMUArgs(string(out))
	if err != nil {
		return nil, "", fmt.Errorf("vunet qemu-args output: %w", err)
	}
	return args, string(out), nil
}

// parseQEMUArgs splits `vunet qemu-args` output (one option per line, lines
// joined by trailing backslashes, shell-style) into arguments. It accepts
// only what it can split without a shell: no quotes or escapes inside
// words, so a path with spaces is refused rather than mangled.
func parseQEMUArgs(out string) ([]string, error) {
	joined := strings.ReplaceAll(out, "\\\n", " ")
	if strings.ContainsAny(joined, "'\"\\") {
		return nil, fmt.Errorf("quoting in %q: cannot split without a shell", strings.TrimSpace(out))
	}
	args := strings.Fields(joined)
	if len(args) == 0 {
		return nil, fmt.Errorf("empty")
	}
	return args, nil
}

// withoutOptionROM adds romfile= to the virtio-net-pci device: the guest
// boots a kernel directly and needs no iPXE, and hosts installed without
// recommended packages lack the ROM file QEMU would otherwise insist on.
func withoutOptionROM(args []string) ([]string, error) {
	out := append([]string(nil), args...)
	found := false
	for i := 0; i+1 < len(out); i++ {
		if out[i] == "-device" && strings.HasPrefix(out[i+1], "virtio-net-pci,") {
			if !strings.Contains(out[i+1], "romfile=") {
				out[i+1] += ",romfile="
			}
			found = true
		}
	}
	if !found {
		return nil, fmt.Errorf("no virtio-net-pci device in %q", strings.Join(args, " "))
	}
	return out, nil
}
