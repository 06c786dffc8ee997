// Package setup holds setup.sh, the one prerequisite check behind
// `make demo`, `make test` and .ci/run, and its test.
//
// setup.sh checks the Go toolchain against go.mod first (an old go fails on
// go.mod with an error that does not name the problem), then every Debian
// package the target needs in one dpkg-query. As root it installs what is
// missing with apt-get; otherwise it prints the one `apt-get install …`
// line to run and exits 2:
//
//	test/setup/setup.sh demo   # what the demo needs (README lists exactly these)
//	test/setup/setup.sh test   # what make test needs (the demo's and more)
//
// The test runs the script with a PATH that holds only stand-ins for go,
// dpkg-query, id and apt-get, so the prerequisites are hidden whatever this
// machine has installed, and checks the exact install line. Nothing imports
// this package.
package setup
