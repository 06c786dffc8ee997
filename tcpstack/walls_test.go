package tcpstack

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestPackageWalls: the data path's packages import each other one way
// only (package doc, "Layout"): the root imports the others and nothing
// imports the root; tcp and dgram never import each other or the link
// services; the link services know only the wire formats. A new import
// across a wall fails here before it becomes a habit.
func TestPackageWalls(t *testing.T) {
	allowed := map[string][]string{
		"addrpolicy":          {},
		"header":              {},
		"hostsock":            {},
		"handover":            {},
		"flowdir":             {},
		"stats":               {"tcpstack/addrpolicy"},
		"linksvc":             {"tcpstack/header"},
		"guestring":           {"tcpstack/header", "tcpstack/stats", "virtqueue"},
		"tcp":                 {"tcpstack/addrpolicy", "tcpstack/guestring", "tcpstack/header", "tcpstack/hostsock", "tcpstack/stats", "virtqueue"},
		"dgram":               {"tcpstack/addrpolicy", "tcpstack/guestring", "tcpstack/header", "tcpstack/hostsock", "tcpstack/stats", "virtqueue"},
		"stream":              {"tcpstack/guestring", "tcpstack/hostsock", "tcpstack/stats", "virtqueue"},
		"internal/guestframe": {"tcpstack/header"},
	}
	for dir, ok := range allowed {
		files, _ := filepath.Glob(filepath.Join(dir, "*.go"))
		if len(files) == 0 {
			t.Errorf("%s: no Go files", dir)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			for _, imp := range vunetImports(t, f) {
				if !slices.Contains(ok, imp) {
					t.Errorf("%s imports vunet/%s, across a wall", f, imp)
				}
			}
		}
	}
	// Every package of the tree is covered.
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if _, known := allowed[e.Name()]; e.IsDir() && e.Name() != "testdata" && e.Name() != "internal" && !known {
			t.Errorf("package %s has no walls declared here", e.Name())
		}
	}
}

// vunetImports returns the module-local imports of a Go file, without the
// "vunet/" prefix.
func vunetImports(t *testing.T, path string) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, s := range f.Imports {
		p, _ := strconv.Unquote(s.Path.Value)
		if rest, ok := strings.CutPrefix(p, "vunet/"); ok {
			out = append(out, rest)
		}
	}
	return out
}
