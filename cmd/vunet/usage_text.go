package main

import (
	"flag"
	"fmt"
	"io"
	"strings"
)

// --help fits a 100-column terminal: flag spellings in a 30-column left
// column, the help text wrapped beside it.
const (
	helpWidth  = 100
	helpLeft   = 30
	helpIndent = 2 + helpLeft + 1
)

// writeUsageEntry writes one option of --help: its spellings, then the
// help text wrapped at helpWidth. Spellings too long for the left column
// get a line of their own.
func writeUsageEntry(w io.Writer, left, help string) {
	lines := wrapWords(help, helpWidth-helpIndent)
	if len(left) > helpLeft {
		fmt.Fprintf(w, "  %s\n", left)
		left = ""
	}
	for i, l := range lines {
		if i > 0 {
			left = ""
		}
		fmt.Fprintf(w, "  %-*s %s\n", helpLeft, left, l)
	}
}

// wrapWords breaks text into lines of at most width columns at spaces (a
// word longer than width gets a line of its own).
func wrapWords(text string, width int) []string {
	var lines []string
	line := ""
	for _, word := range strings.Fields(text) {
		switch {
		case line == "":
			line = word
		case len(line)+1+len(word) <= width:
			line += " " + word
		default:
			lines = append(lines, line)
			line = word
		}
	}
	return append(lines, line)
}

// flagDoc is one option as --help, the manual page and the shell
// completions present it, all three read from the same flag definitions.
type flagDoc struct {
	group string
	names []string // long names first, passt's short letter last
	arg   string   // the value's name (PATH, N); "" for a switch
	help  string
}

// spelled is the option's spellings as typed: --socket, -s.
func (d flagDoc) spelled() []string {
	out := make([]string, len(d.names))
	for i, n := range d.names {
		out[i] = dashed(n)
	}
	return out
}

func docOf(group string, names []string, f *flag.Flag) flagDoc {
	arg, help := flag.UnquoteUsage(f)
	if arg == "value" { // flag's name for a value without a `NAME` in its help
		arg = "VALUE"
	}
	return flagDoc{group: group, names: names, arg: arg, help: help}
}

// daemonFlagDocs lists the daemon's options in --help order.
func daemonFlagDocs() []flagDoc {
	fs, table := newOptions().flagSet()
	var docs []flagDoc
	for _, g := range groups {
		for _, op := range table {
			if op.group == g {
				docs = append(docs, docOf(g, op.names, fs.Lookup(op.names[0])))
			}
		}
	}
	return docs
}

// helperFlagDocs lists a helper subcommand's own options.
func helperFlagDocs(name string) []flagDoc {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	var hc helperConfig
	var qemuVer string
	var docs []flagDoc
	for _, n := range addHelperFlags(name, fs, &hc, &qemuVer) {
		docs = append(docs, docOf("", []string{n}, fs.Lookup(n)))
	}
	return docs
}
