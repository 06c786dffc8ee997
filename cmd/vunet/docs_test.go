package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// allSpellings is every way of writing every daemon option.
func allSpellings() []string {
	var out []string
	for _, d := range daemonFlagDocs() {
		out = append(out, d.spelled()...)
	}
	return out
}

// TestHelpFitsIn100Columns: --help and the helpers' help fit a 100-column
// terminal, and --help lists every option.
func TestHelpFitsIn100Columns(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"qemu-args", "--help"}, {"libvirt-xml", "--help"}, {"ctl", "--help"}} {
		var out, errb bytes.Buffer
		if code := run(args, &out, &errb); code != 0 {
			t.Fatalf("vunet %q: exit %d: %s", args, code, errb.String())
		}
		for i, line := range strings.Split(out.String(), "\n") {
			if n := utf8.RuneCountInString(line); n > helpWidth {
				t.Errorf("vunet %s, line %d: %d columns: %q", strings.Join(args, " "), i+1, n, line)
			}
		}
		if args[0] == "--help" {
			for _, s := range allSpellings() {
				if !strings.Contains(out.String(), s) {
					t.Errorf("--help lacks %s", s)
				}
			}
		}
	}
}

func TestWrapWords(t *testing.T) {
	got := wrapWords("aa bb cc dddddddd e", 5)
	want := []string{"aa bb", "cc", "dddddddd", "e"}
	if !slices.Equal(got, want) {
		t.Errorf("wrapWords: %q, want %q", got, want)
	}
}

// TestManPageRenders: `vunet man` is a page man(1) formats without a
// warning, and it documents every option and the helpers' own.
func TestManPageRenders(t *testing.T) {
	manBin := needTool(t, "man", "man-db")
	dir := t.TempDir()
	var page, errb bytes.Buffer
	if code := run([]string{"man"}, &page, &errb); code != 0 {
		t.Fatalf("vunet man: exit %d: %s", code, errb.String())
	}
	if err := os.WriteFile(filepath.Join(dir, "vunet.1"), page.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	// As the README says: man ./vunet.1 (a path, not a page name).
	cmd := exec.Command(manBin, "--warnings=w,all", "./vunet.1")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "MANWIDTH=100", "LC_ALL=C.UTF-8", "MANPAGER=cat", "PAGER=cat")
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil || stderr.Len() != 0 {
		t.Fatalf("man ./vunet.1: %v\n%s", err, stderr.String())
	}
	text := out.String()
	for _, want := range []string{"NAME", "SYNOPSIS", "OPTIONS", "COMMANDS", "SIGNALS", "ENVIRONMENT", "EXIT STATUS",
		"vunet - vhost-user network back-end", "NOTIFY_SOCKET", "LISTEN_FDS", "vunet " + buildInfo().Version} {
		if !strings.Contains(text, want) {
			t.Errorf("rendered page lacks %q", want)
		}
	}
	// Every spelling, as a user would type it (ASCII hyphens: \- renders
	// as -, so a pasted option works).
	for _, s := range allSpellings() {
		if !strings.Contains(text, s) {
			t.Errorf("rendered page lacks %s", s)
		}
	}
	for _, hc := range helperCommands {
		for _, d := range helperFlagDocs(hc.name) {
			if !strings.Contains(text, d.spelled()[0]) {
				t.Errorf("rendered page lacks %s %s", hc.name, d.spelled()[0])
			}
		}
	}
	for _, want := range []string{"vunet ctl", "CONTROL", "/v1/forwards", "/v1/status"} {
		if !strings.Contains(text, want) {
			t.Errorf("rendered page lacks %q", want)
		}
	}
	for _, c := range ctlCommands {
		if !strings.Contains(text, c.does) && !strings.Contains(text, c.name+" ") {
			t.Errorf("rendered page lacks vunet ctl %s", c.name)
		}
	}
	for _, d := range ctlFlagDocs() {
		if !strings.Contains(text, d.spelled()[0]) {
			t.Errorf("rendered page lacks vunet ctl %s", d.spelled()[0])
		}
	}
}

// bashComplete runs the generated bash completion for a command line (the
// last word being completed) and returns what it offers.
func bashComplete(t *testing.T, script string, words ...string) []string {
	t.Helper()
	bash := needTool(t, "bash", "bash")
	var q []string
	for _, w := range words {
		q = append(q, "'"+strings.ReplaceAll(w, "'", `'\''`)+"'")
	}
	prog := "source " + script + "\nCOMP_WORDS=(" + strings.Join(q, " ") + ")\nCOMP_CWORD=" +
		strconv.Itoa(len(words)-1) + "\n_vunet\nprintf '%s\\n' \"${COMPREPLY[@]}\"\n"
	out, err := exec.Command(bash, "-c", prog).CombinedOutput()
	if err != nil {
		t.Fatalf("bash completion of %q: %v\n%s", words, err, out)
	}
	return strings.Fields(string(out))
}

func writeCompletion(t *testing.T, shell, name string) string {
	t.Helper()
	var out, errb bytes.Buffer
	if code := run([]string{"completion", shell}, &out, &errb); code != 0 {
		t.Fatalf("vunet completion %s: exit %d: %s", shell, code, errb.String())
	}
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, out.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestBashCompletion(t *testing.T) {
	script := writeCompletion(t, "bash", "vunet.bash")
	files := t.TempDir()
	for _, f := range []string{"vm1.sock", "vm2.sock"} {
		os.WriteFile(filepath.Join(files, f), nil, 0o644)
	}
	for _, tc := range []struct {
		words []string
		want  []string
	}{
		{[]string{"vunet", "--soc"}, []string{"--socket", "--socket-mode", "--socket-path"}},
		{[]string{"vunet", "--log-format", ""}, []string{"json", "text"}},
		{[]string{"vunet", "-s", files + "/vm"}, []string{files + "/vm1.sock", files + "/vm2.sock"}},
		{[]string{"vunet", "--queues", ""}, nil},
		{[]string{"vunet", "q"}, []string{"qemu-args"}},
		{[]string{"vunet", "qemu-args", "--me"}, []string{"--mem", "--metrics"}},
		{[]string{"vunet", "libvirt-xml", "--dom"}, []string{"--domain"}},
		{[]string{"vunet", "completion", ""}, []string{"bash", "zsh"}},
		{[]string{"vunet", "c"}, []string{"completion", "ctl"}},
		{[]string{"vunet", "ctl", "--con"}, []string{"--control"}},
		{[]string{"vunet", "ctl", "--control", files + "/vm1"}, []string{files + "/vm1.sock"}},
		{[]string{"vunet", "ctl", "re"}, []string{"remove"}},
		{[]string{"vunet", "ctl", "--control", "x", "add", "-"}, []string{"--control", "--json", "--tcp-ports", "--udp-ports", "-t", "-u"}},
	} {
		got := bashComplete(t, script, tc.words...)
		slices.Sort(got)
		if !slices.Equal(got, tc.want) {
			t.Errorf("%q: %q, want %q", tc.words, got, tc.want)
		}
	}
	// Every option is offered.
	got := bashComplete(t, script, "vunet", "-")
	for _, s := range allSpellings() {
		if !slices.Contains(got, s) {
			t.Errorf("bash does not offer %s", s)
		}
	}
}

// zshComplete types a command line and TAB into an interactive zsh (on a
// pseudo-terminal) with the generated completion installed, and returns
// the matches the completion system was given.
func zshComplete(t *testing.T, dir, line string) []string {
	t.Helper()
	zsh := needTool(t, "zsh", "zsh")
	out := filepath.Join(t.TempDir(), "matches")
	driver := `zmodload zsh/zpty
zpty z 'zsh -f -i'
zpty -w z "fpath=(` + dir + ` \$fpath); autoload -Uz compinit; compinit -u -d ` + dir + `/zcompdump"
zpty -w z "compadd() { local -a __h; builtin compadd -O __h \"\$@\"; print -rl -- \$__h >> ` + out + `; builtin compadd \"\$@\" }"
zpty -n -w z "$1"$'\t'
for i in {1..100}; do [[ -s ` + out + ` ]] && break; sleep 0.05; done
sleep 0.2
zpty -d z
`
	cmd := exec.Command(zsh, "-f", "-c", driver, "zsh", line)
	cmd.WaitDelay = 5 * time.Second
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("zsh driver: %v\n%s", err, b)
	}
	b, _ := os.ReadFile(out)
	var got []string
	for _, l := range strings.Split(string(b), "\n") {
		if l != "" && !slices.Contains(got, l) {
			got = append(got, l)
		}
	}
	slices.Sort(got)
	return got
}

func TestZshCompletion(t *testing.T) {
	script := writeCompletion(t, "zsh", "_vunet")
	zsh := needTool(t, "zsh", "zsh")
	if out, err := exec.Command(zsh, "-n", script).CombinedOutput(); err != nil {
		t.Fatalf("zsh -n _vunet: %v\n%s", err, out)
	}
	dir := filepath.Dir(script)
	for _, tc := range []struct {
		line string
		want []string
	}{
		{"vunet --soc", []string{"--socket", "--socket-mode", "--socket-path"}},
		{"vunet --log-format ", []string{"json", "text"}},
		{"vunet qemu-args --me", []string{"--mem", "--metrics"}},
		{"vunet completion ", []string{"bash", "zsh"}},
		{"vunet ctl --con", []string{"--control"}},
		{"vunet ctl --control x st", []string{"status"}},
	} {
		if got := zshComplete(t, dir, tc.line); !slices.Equal(got, tc.want) {
			t.Errorf("%q: %q, want %q", tc.line, got, tc.want)
		}
	}
}

// TestCompletionWordsAccepted: the fixed values the completions offer are
// values vunet accepts.
func TestCompletionWordsAccepted(t *testing.T) {
	for name, words := range enumValues {
		for _, w := range words {
			if _, err := parseFlags([]string{"--socket", "/tmp/x.sock", "--" + name, w}, &bytes.Buffer{}); err != nil {
				t.Errorf("--%s %s offered but refused: %v", name, w, err)
			}
		}
	}
}
