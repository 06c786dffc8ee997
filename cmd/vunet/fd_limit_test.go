package main

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"vunet/tcpstack"
	"vunet/tcpstack/tcp"
)

type fakeRlimit struct {
	lim    unix.Rlimit
	setErr error
	sets   []unix.Rlimit
}

func (f *fakeRlimit) get() (unix.Rlimit, error) { return f.lim, nil }
func (f *fakeRlimit) set(l unix.Rlimit) error {
	f.sets = append(f.sets, l)
	if f.setErr != nil {
		return f.setErr
	}
	f.lim = l
	return nil
}

func TestFitFDLimit(t *testing.T) {
	// Defaults, one pair: 1024 + 4096 flows + 11 + 64 overhead = 5195.
	const defaultNeed = 1024 + 4096 + fdPerPair + fdOverhead
	for _, tc := range []struct {
		name           string
		queues         int
		maxFlows, tcp  int // flags (0: default)
		forwards       int
		udpForwards    int
		cur, max       uint64
		setErr         error
		wantErr        string
		wantCur        uint64 // soft limit afterwards
		wantUDP, wantT int    // table sizes afterwards (0: unchanged)
		wantWarning    string
	}{
		{name: "enough", queues: 1, cur: 1 << 20, max: 1 << 20, wantCur: 1 << 20},
		{name: "soft raised to what is needed", queues: 1, cur: 1024, max: 1 << 20, wantCur: defaultNeed},
		{name: "infinite hard limit", queues: 2, cur: 1024, max: unix.RLIM_INFINITY, wantCur: 2*(1024+4096+fdPerPair) + fdOverhead},
		{name: "forwards count", queues: 1, forwards: 100, cur: defaultNeed, max: defaultNeed, wantCur: defaultNeed,
			wantUDP: (defaultNeed - 100 - fdOverhead - fdPerPair) / 5, wantT: defaultNeed - 100 - fdOverhead - fdPerPair - (defaultNeed-100-fdOverhead-fdPerPair)/5,
			wantWarning: "flow limits lowered"},
		{name: "UDP forwards count their peers' flows", queues: 1, udpForwards: 2, cur: 1024, max: 1 << 20,
			wantCur: defaultNeed + 2 + 1024/4},
		{name: "defaults lowered under a low hard limit", queues: 2, cur: 1024, max: 4096, wantCur: 4096,
			wantUDP: (4096 - fdOverhead - 2*fdPerPair) / 2 / 5, wantT: (4096-fdOverhead-2*fdPerPair)/2 - (4096-fdOverhead-2*fdPerPair)/2/5,
			wantWarning: "raise the limit"},
		{name: "explicit limits refused", queues: 1, tcp: 100000, cur: 4096, max: 4096,
			wantErr: "open-files limit is 4096 (hard), below 1 queue pair(s) × (1024 UDP/ICMP + 100000 TCP flows + 11)"},
		{name: "too low for anything", queues: 4, cur: 256, max: 256, wantErr: "too low for even 64 flows per queue pair"},
		{name: "raise fails", queues: 1, cur: 1024, max: 1 << 20, setErr: errors.New("EPERM"), wantErr: "raising it failed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := &options{queues: tc.queues, maxFlows: tc.maxFlows, maxTCPFlows: tc.tcp}
			sc := &stackConfig{cfg: tcpstack.Config{MaxFlows: tc.maxFlows, TCP: tcp.Config{MaxFlows: tc.tcp}}}
			sc.cfg.TCPForwards = make([]tcpstack.Forward, tc.forwards)
			sc.cfg.UDPForwards = make([]tcpstack.Forward, tc.udpForwards)
			rl := &fakeRlimit{lim: unix.Rlimit{Cur: tc.cur, Max: tc.max}, setErr: tc.setErr}
			err := fitFDLimit(o, sc, rl)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if rl.lim.Cur != tc.wantCur {
				t.Errorf("soft limit %d, want %d", rl.lim.Cur, tc.wantCur)
			}
			if tc.wantUDP != 0 && (sc.cfg.MaxFlows != tc.wantUDP || sc.cfg.TCP.MaxFlows != tc.wantT) {
				t.Errorf("tables %d UDP %d TCP, want %d %d", sc.cfg.MaxFlows, sc.cfg.TCP.MaxFlows, tc.wantUDP, tc.wantT)
			}
			if tc.wantUDP == 0 && (sc.cfg.MaxFlows != tc.maxFlows || sc.cfg.TCP.MaxFlows != tc.tcp) {
				t.Errorf("tables changed to %d %d", sc.cfg.MaxFlows, sc.cfg.TCP.MaxFlows)
			}
			if got := strings.Join(sc.warnings, "\n"); !strings.Contains(got, tc.wantWarning) || (tc.wantWarning == "") != (got == "") {
				t.Errorf("warnings %q, want %q", got, tc.wantWarning)
			}
			if tc.wantUDP != 0 {
				used := uint64(tc.queues)*uint64(sc.cfg.MaxFlows+sc.cfg.TCP.MaxFlows+fdPerPair) + uint64(tc.forwards) + fdOverhead
				if used > rl.lim.Cur {
					t.Errorf("lowered tables need %d descriptors, limit %d", used, rl.lim.Cur)
				}
			}
		})
	}
}

// TestFDLimitAtStartup runs the daemon under a hard open-files limit below
// what the flow limits need: explicit limits are refused with the numbers,
// default ones lowered with a warning.
func TestFDLimitAtStartup(t *testing.T) {
	prlimit, err := exec.LookPath("prlimit")
	if err != nil {
		t.Skip("prlimit not found (util-linux)")
	}
	sock := filepath.Join(t.TempDir(), "v.sock")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, prlimit, "--nofile=2048:2048", vunetBinary(t), "-s", sock, "--max-tcp-flows", "8192")
	out, _ := cmd.CombinedOutput()
	if cmd.ProcessState == nil || cmd.ProcessState.ExitCode() != 1 ||
		!strings.Contains(string(out), "open-files limit is 2048 (hard)") || !strings.Contains(string(out), "--max-tcp-flows") {
		t.Fatalf("explicit flow limits above the hard limit: exit %v, output %s", cmd.ProcessState, out)
	}
	if _, err := os.Lstat(sock); !os.IsNotExist(err) {
		t.Errorf("socket created despite the error (%v)", err)
	}
	d := startWrapped(t, []string{prlimit, "--nofile=2048:2048"}, "-s", sock)
	m := d.waitMsg(t, "vunet option not enforced", 10*time.Second)
	if w, _ := m["warning"].(string); !strings.Contains(w, "flow limits lowered to") {
		t.Fatalf("warning %q", w)
	}
}
