package main

import (
	"fmt"
	"runtime/debug"

	"vunet/metrics"
)

// version and revision may be set at link time:
//
//	go build -ldflags "-X main.version=1.2.3 -X main.revision=$(git rev-parse HEAD)" ./cmd/vunet
//
// (make build does, from git). Unset, they come from the build information
// Go stamps into the binary: the module version and the VCS revision of a
// checkout. Go stamps no VCS data with -buildvcs=false, for go run, or in a
// git worktree (its .git is a file), hence the link-time fallback.
var version, revision string

// buildInfo says which build runs, for --version, the start-up log line and
// vunet_build_info alike.
func buildInfo() metrics.BuildInfo {
	bi, _ := debug.ReadBuildInfo()
	return buildInfoFrom(version, revision, bi)
}

// buildInfoFrom derives the three values from the link-time version and
// revision and Go's build information (nil when the binary has none). What
// was given at link time wins.
func buildInfoFrom(ldVersion, ldRevision string, bi *debug.BuildInfo) metrics.BuildInfo {
	info := metrics.BuildInfo{Version: ldVersion, Revision: "unknown", GoVersion: "unknown"}
	if ldRevision != "" {
		info.Revision = ldRevision
	}
	if bi == nil {
		if info.Version == "" {
			info.Version = "devel"
		}
		return info
	}
	info.GoVersion = bi.GoVersion
	if info.Version == "" {
		// "(devel)" is what Go says for a build outside any VCS
		// checkout; since Go 1.24 a checkout gives a pseudo-version
		// (v0.0.0-20260102150405-abcdef123456+dirty) or its tag.
		info.Version = bi.Main.Version
		if info.Version == "" || info.Version == "(devel)" {
			info.Version = "devel"
		}
	}
	var rev, modified string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			modified = s.Value
		}
	}
	if rev != "" && ldRevision == "" {
		info.Revision = rev
		if modified == "true" {
			info.Revision += "+dirty"
		}
	}
	return info
}

// versionLine is what --version prints.
func versionLine(b metrics.BuildInfo) string {
	return fmt.Sprintf("vunet %s (revision %s, %s)", b.Version, b.Revision, b.GoVersion)
}
