// Package qemuvm is the QEMU section of `make bench`: a real guest (TCG,
// the e2e suite's image and agent) downloads and uploads through each
// back-end in turn, then times 1-byte round trips, while the back-end's
// CPU time is read from /proc/PID/stat around each transfer. Under TCG the
// guest sets the pace; what the back-end spends per byte is what a user of
// a real VM pays, and on a small machine every CPU-second the back-end
// takes is a CPU-second the guest does not get.
//
// It is a Go benchmark so that it can use the QEMU machinery
// (vunet/test/qemu), which needs a testing.TB; test/bench runs it with
// `go test -run '^$' -bench BenchmarkQEMUGuest -benchtime 1x` and reads the
// JSON rows it writes. It does nothing unless VUNET_BENCH_QEMU_OUT names
// that file; the other variables are:
//
//	VUNET_BENCH_QEMU_BACKENDS  JSON [{"name": ..., "template": ...}], in order;
//	                           {socket}, {metrics} and {vunet} are filled in
//	VUNET_BENCH_QEMU_BYTES     bytes per transfer (default 300 MB)
//	VUNET_BENCH_QEMU_RR        duration of the round-trip test (default 3s)
package qemuvm
