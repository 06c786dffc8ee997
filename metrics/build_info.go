package metrics

// BuildInfo identifies the running build. vunet_build_info exports it and
// `vunet --version` prints the same three values, so a scrape and a shell
// agree on what runs.
type BuildInfo struct {
	// Version is the release version given at link time, else the module
	// version Go stamped (a pseudo-version from the checkout's VCS data),
	// else "devel".
	Version string
	// Revision is the VCS commit the binary was built from, with "+dirty"
	// when the checkout had uncommitted changes; "unknown" when the build
	// carried no VCS data (go run, go test, -buildvcs=false).
	Revision string
	// GoVersion is the Go toolchain that built the binary.
	GoVersion string
}
