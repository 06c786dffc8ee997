package rig

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestSandboxRefusals finds refused calls in vunet's text and JSON logs.
func TestSandboxRefusals(t *testing.T) {
	path := filepath.Join(t.TempDir(), "backend.log")
	log := `time=2026-01-01T00:00:00Z level=INFO msg="sandbox applied" user=nobody
time=2026-01-01T00:00:01Z level=WARN msg="sandbox refused a system call" syscall=execve nr=59 errno=EPERM
{"time":"2026-01-01T00:00:02Z","level":"WARN","msg":"sandbox refused a system call","syscall":"ptrace","nr":101}
`
	if err := os.WriteFile(path, []byte(log), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := sandboxRefusals(path); !slices.Equal(got, []string{"execve", "ptrace"}) {
		t.Fatalf("refusals %v, want execve and ptrace", got)
	}
}
