// Command rig brings up the vunet netns/TAP rig by hand (see package
// vunet/test/rig): a kernel TCP/IP stack in a namespace of its own plays the
// guest of a vhost-user back-end.
//
//	go run ./test/rig up [flags]        # until Ctrl-C / rig down
//	go run ./test/rig exec -- CMD...    # in the guest namespace
//	go run ./test/rig exec --host -- CMD...
//	go run ./test/rig down              # tear every rig down
//
// It must be run as root.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	rig "vunet/test/rig/lib"
)

func usage() {
	fmt.Fprint(os.Stderr, `usage: rig <command> [flags]

Commands:
  up      bring a rig up, print how to enter its namespaces, run until Ctrl-C or "rig down"
  exec    run a command in a running rig's guest namespace (--host: the back-end's)
          rig exec [--name NAME] [--host] -- CMD [ARGS...]
  down    tear down running rigs (all, or --name NAME) and sweep stale ones
  status  list running rigs and stale namespaces

Run "rig up -h" for the rig's options. Needs root, iproute2 and busybox (udhcpc).
`)
}

func main() {
	if len(os.Args) < 2 {
		usage()
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "up":
		err = up(os.Args[2:])
	case "exec":
		err = execIn(os.Args[2:])
	case "down":
		err = down(os.Args[2:])
	case "status":
		err = status()
	case "-h", "--help", "help":
		usage()
		return
	default:
		usage()
		os.Exit(2)
	}
	if err != nil {
		var ce childExit
		if errors.As(err, &ce) {
			os.Exit(ce.code)
		}
		fmt.Fprintln(os.Stderr, "rig:", err)
		os.Exit(1)
	}
}

// state is what "up" leaves in the rig's work directory for exec and down.
type state struct {
	Name, GuestNetns, HostNetns string
	PID, BackendPID             int
	Guest, Gateway              string
	MTU                         int
	Socket, BackendLog          string
}

const stateFile = "rig.json"

type kvFlag map[string]string

func (f kvFlag) String() string { return fmt.Sprint(map[string]string(f)) }
func (f kvFlag) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok {
		return fmt.Errorf("want key=value, got %q", s)
	}
	f[k] = v
	return nil
}

func up(args []string) error {
	fs := flag.NewFlagSet("up", flag.ExitOnError)
	backend := fs.String("backend", strings.Join(rig.DefaultBackend, " "),
		"back-end command template; {socket} = vhost-user socket, {metrics} = metrics address, {vunet} = vunet built from ./cmd/vunet")
	ring := fs.Uint("ring", 256, "ring size (both rings)")
	rxRing := fs.Uint("rx-ring", 0, "RX ring size (0: --ring); 16 starves the back-end")
	txRing := fs.Uint("tx-ring", 0, "TX ring size (0: --ring)")
	slowRX := fs.Duration("slow-rx", 0, "slow guest reader: hold used RX buffers this long before re-posting them")
	mtu := fs.Int("mtu", 0, "guest MTU (0: what DHCP says; static: 65520)")
	static := fs.Bool("static", false, "static guest addressing instead of DHCP")
	noHostNS := fs.Bool("no-host-netns", false, "run the back-end in the current namespace")
	testpmd := fs.Bool("testpmd", false, "DPDK testpmd is the front-end (its TAP in the guest namespace, MTU 1500; pass the MTU to the back-end, e.g. --mtu {mtu})")
	alone := fs.Bool("alone", false, "the rig front-end alone: no back-end, a second TAP in a peer namespace (rig exec --host) at the gateway address")
	hostSys, guestSys := kvFlag{}, kvFlag{}
	fs.Var(hostSys, "host-sysctl", "key=value set in the back-end's namespace (repeatable), e.g. net.ipv4.tcp_rmem='4096 16384 65536'")
	fs.Var(guestSys, "guest-sysctl", "key=value set in the guest namespace (repeatable)")
	queues := fs.Int("queues", 1, "queue pairs (the default back-end gets --queues); the guest's frames go to one TX ring at a time")
	rotate := fs.Duration("tx-rotate", 0, "move the guest's transmissions to the next TX ring this often (after the old ring drained)")
	eager := fs.Bool("tx-rotate-eager", false, "with -tx-rotate: move at once, frames still on the old ring")
	loss := fs.Float64("loss", 0, "lose this fraction of the frames, each way (e.g. 0.01)")
	reorder := fs.Float64("reorder", 0, "deliver this fraction of the frames after the next one, each way")
	dup := fs.Float64("dup", 0, "duplicate this fraction of the frames, each way")
	seed := fs.Uint64("seed", 1, "seed of -loss, -reorder and -dup")
	verbose := fs.Bool("v", false, "log the rig's steps")
	fs.Parse(args)
	if *queues > 1 && *backend == strings.Join(rig.DefaultBackend, " ") {
		*backend += " --queues " + strconv.Itoa(*queues)
	}

	lvl := slog.LevelWarn
	if *verbose {
		lvl = slog.LevelDebug
	}
	opts := rig.Options{
		Backend:       strings.Fields(*backend),
		RingSize:      uint16(*ring),
		RXRingSize:    uint16(*rxRing),
		TXRingSize:    uint16(*txRing),
		SlowRX:        *slowRX,
		MTU:           *mtu,
		DHCP:          !*static,
		NoHostNetns:   *noHostNS,
		HostSysctls:   hostSys,
		GuestSysctls:  guestSys,
		Loopback:      *alone,
		QueuePairs:    *queues,
		TXRotate:      *rotate,
		TXRotateEager: *eager,
		Impair:        rig.Impairment{Loss: *loss, Reorder: *reorder, Duplicate: *dup, Seed: *seed},
		Log:           slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl})),
	}
	if *testpmd {
		opts.Frontend = rig.FrontendTestpmd
	}
	r, err := rig.Start(context.Background(), opts)
	if err != nil {
		rig.Cleanup()
		return err
	}
	st := state{Name: r.Name(), GuestNetns: r.GuestNetns(), HostNetns: r.HostNetns(), PID: os.Getpid(),
		BackendPID: r.BackendPID(), Guest: r.GuestAddr().String(), Gateway: r.Gateway().String(),
		MTU: r.MTU(), Socket: r.Socket(), BackendLog: r.BackendLog()}
	b, _ := json.MarshalIndent(st, "", "  ")
	if err := os.WriteFile(filepath.Join(r.Dir(), stateFile), b, 0o644); err != nil {
		r.Close()
		return err
	}
	fmt.Printf(`rig %s is up (back-end pid %d, log %s)
  guest: %s via %s, mtu %d, features %#x
  enter the guest:     ip netns exec %s bash     (or: rig exec -- CMD)
`, r.Name(), r.BackendPID(), r.BackendLog(), r.GuestAddr(), r.Gateway(), r.MTU(), r.Features(), r.GuestNetns())
	if r.HostNetns() != "" {
		fmt.Printf(`  enter the back-end's: ip netns exec %s bash     (or: rig exec --host -- CMD)
  e.g. ip netns exec %s iperf3 -s -B 127.0.0.1 &   then   ip netns exec %s iperf3 -c %s
`, r.HostNetns(), r.HostNetns(), r.GuestNetns(), r.Gateway())
	}
	fmt.Println("Ctrl-C or `rig down` tears everything down.")
	// The rig package's signal handler closes the rig and ends the process.
	for {
		time.Sleep(time.Second)
		if err := r.Err(); err != nil {
			r.Close()
			rig.Cleanup()
			return fmt.Errorf("data path failed: %w", err)
		}
		if r.BackendExited() {
			r.Close()
			rig.Cleanup()
			return fmt.Errorf("back-end exited; log:\n%s", readTail(st.BackendLog))
		}
	}
}

func readTail(p string) string {
	b, _ := os.ReadFile(p)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// running lists the states of rigs whose "up" process is alive.
func running() []state {
	matches, _ := filepath.Glob(filepath.Join(os.TempDir(), "vunet-rig-*", stateFile))
	var out []state
	for _, m := range matches {
		b, err := os.ReadFile(m)
		if err != nil {
			continue
		}
		var st state
		if json.Unmarshal(b, &st) != nil {
			continue
		}
		if syscall.Kill(st.PID, 0) == nil {
			out = append(out, st)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

func pick(name string) (state, error) {
	rs := running()
	if name != "" {
		for _, st := range rs {
			if st.Name == name {
				return st, nil
			}
		}
		return state{}, fmt.Errorf("no running rig named %s", name)
	}
	switch len(rs) {
	case 0:
		return state{}, errors.New("no rig is up (rig up)")
	case 1:
		return rs[0], nil
	}
	var names []string
	for _, st := range rs {
		names = append(names, st.Name)
	}
	return state{}, fmt.Errorf("several rigs are up, pick one with --name: %s", strings.Join(names, " "))
}

func execIn(args []string) error {
	fs := flag.NewFlagSet("exec", flag.ExitOnError)
	name := fs.String("name", "", "rig name (default: the only running one)")
	host := fs.Bool("host", false, "run in the back-end's namespace instead of the guest's")
	fs.Parse(args)
	cmdArgs := fs.Args()
	if len(cmdArgs) == 0 {
		return errors.New("exec: no command (rig exec -- CMD ARGS...)")
	}
	st, err := pick(*name)
	if err != nil {
		return err
	}
	ns := st.GuestNetns
	if *host {
		if st.HostNetns == "" {
			return errors.New("exec --host: this rig's back-end runs in the current namespace")
		}
		ns = st.HostNetns
	}
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns}, cmdArgs...)...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return childExit{ee.ExitCode()}
		}
		return err
	}
	return nil
}

// childExit passes the exit status of the command run by exec through.
type childExit struct{ code int }

func (c childExit) Error() string { return fmt.Sprintf("exit status %d", c.code) }

func down(args []string) error {
	fs := flag.NewFlagSet("down", flag.ExitOnError)
	name := fs.String("name", "", "rig name (default: all)")
	fs.Parse(args)
	for _, st := range running() {
		if *name != "" && st.Name != *name {
			continue
		}
		syscall.Kill(st.PID, syscall.SIGTERM)
		deadline := time.Now().Add(15 * time.Second)
		for syscall.Kill(st.PID, 0) == nil && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		if syscall.Kill(st.PID, 0) == nil {
			return fmt.Errorf("rig %s (pid %d) did not exit", st.Name, st.PID)
		}
		fmt.Println("rig", st.Name, "is down")
	}
	if stale := rig.Stale(); len(stale) > 0 {
		fmt.Println("sweeping stale namespaces:", strings.Join(stale, " "))
	}
	return rig.Sweep()
}

func status() error {
	for _, st := range running() {
		fmt.Printf("%s: pid %d, back-end pid %d, guest %s via %s (netns %s), back-end netns %s\n",
			st.Name, st.PID, st.BackendPID, st.Guest, st.Gateway, st.GuestNetns, st.HostNetns)
	}
	for _, n := range rig.Stale() {
		fmt.Println("stale:", n)
	}
	return nil
}
