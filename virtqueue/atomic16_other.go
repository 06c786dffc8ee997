//go:build !amd64 && !arm64

package virtqueue

// Other architectures lack the assembly helpers; NewSplitQueue refuses to
// build a queue there. These stubs only keep the package compiling.

const atomic16Supported = false

func load16(p *uint16) uint16 { return *p }

func store16(p *uint16, v uint16) { *p = v }
