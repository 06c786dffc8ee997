package qemu

import (
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
)

var daemonHelp struct {
	once sync.Once
	text string
}

// HelpHas reports whether the daemon's --help mentions flag, so a test can
// tell a feature the command line does not offer yet from a broken one.
func HelpHas(t testing.TB, flag string) bool {
	t.Helper()
	if os.Getenv("VUNET_E2E_PASST") != "" {
		return true // passt's flags are the model for ours
	}
	bin := DaemonBinary(t)
	daemonHelp.once.Do(func() {
		out, _ := exec.Command(bin, "--help").CombinedOutput()
		daemonHelp.text = string(out)
	})
	return strings.Contains(daemonHelp.text, flag)
}
