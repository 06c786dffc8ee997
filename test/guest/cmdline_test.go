package guest

import (
	"testing"
	"time"
)

func TestParseCmdline(t *testing.T) {
	c := "console=ttyS0 quiet " + Cmdline([]string{"link", "dhcp"}, map[string]string{"timeout": "7s", "vunet.arp": "10.0.2.2", "txframes": "3"})
	p, err := ParseCmdline(c)
	if err != nil {
		t.Fatalf("ParseCmdline(%q): %v", c, err)
	}
	if len(p.Checks) != 2 || p.Checks[0] != "link" || p.Checks[1] != "dhcp" {
		t.Errorf("checks = %q", p.Checks)
	}
	if p.Timeout != 7*time.Second || p.TXFrames != 3 || p.Values[ParamARP] != "10.0.2.2" {
		t.Errorf("params = %+v", p)
	}
	if _, err := ParseCmdline("vunet.timeout=-1s"); err == nil {
		t.Error("negative timeout accepted")
	}
	if _, err := ParseCmdline("vunet.txframes=0"); err == nil {
		t.Error("zero txframes accepted")
	}
	d, _ := ParseCmdline("console=ttyS0")
	if d.Timeout != DefaultCheckTimeout || d.TXFrames != DefaultTXFrames || len(d.Checks) != 0 {
		t.Errorf("defaults = %+v", d)
	}
}
