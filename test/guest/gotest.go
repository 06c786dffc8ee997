package guest

// The gotest check runs a Go test binary that a test put into the image
// (initramfs.Options.Files), so a test that depends on the kernel can run
// on the guest's kernel: Debian 12's 6.1, where the host runs another.
// The guest needs no network for it; loopback is brought up first.
const (
	// CheckGoTest runs vunet.gotest with -test.run=vunet.gotestrun and
	// -test.v. ok: it exited 0 and reported a PASS. Reports exit, passed
	// (the PASS lines' count), the key=value words of every output line
	// that holds FieldsPrefix, and on failure the output's tail as detail.
	CheckGoTest = "gotest"
	// ParamGoTest is the test binary's path in the image.
	ParamGoTest = "vunet.gotest"
	// ParamGoTestRun is the -test.run pattern (required: the check runs
	// one chosen test, not a package's whole suite).
	ParamGoTestRun = "vunet.gotestrun"
)

// FieldsPrefix marks an output line of a test run by the gotest check
// whose key=value words become fields of the check's result.
const FieldsPrefix = "VUNET-FIELDS "
