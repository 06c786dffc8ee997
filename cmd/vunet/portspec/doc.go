// Package portspec parses passt's port-forwarding specifications, the
// arguments of -t/--tcp-ports and -u/--udp-ports: "all", "none", "auto",
// comma-separated ports and ranges with optional remapping ("22",
// "8000-8010", "2222:22", "8000-8010:9000-9010"), an optional bind address
// and interface prefix ("192.0.2.1/22", "[::1]/22", "%eth0/22",
// "192.0.2.1%eth0/22"; with "all" after the prefix, every non-ephemeral
// port there) and exclusions ("~3000-3010").
//
// The argument is operator input, not guest input, but the parser is fuzzed
// anyway: it must reject, never panic, on any string.
//
// portspec is a leaf: it imports nothing of vunet's.
package portspec
