package main

// Result is one row: one number for one back-end in one test. Rows of the
// same test share Label; the kernel row, if any, is the ceiling.
type Result struct {
	Test           string  `json:"test"`  // machine name, e.g. tcp_throughput
	Label          string  `json:"label"` // table row label, unique per test and parameters
	Backend        string  `json:"backend"`
	Direction      string  `json:"direction,omitempty"` // guest_to_host or host_to_guest
	MTU            int     `json:"mtu,omitempty"`
	Streams        int     `json:"streams,omitempty"`
	Value          float64 `json:"value"`
	Unit           string  `json:"unit"`
	HigherIsBetter bool    `json:"higher_is_better"`
	// KernelFraction is Value over the kernel row's Value (throughput only).
	KernelFraction *float64 `json:"kernel_fraction,omitempty"`
	// CPUSecPerGB is the back-end's utime+stime per 10^9 bytes received.
	CPUSecPerGB *float64 `json:"cpu_s_per_gb,omitempty"`
	// BackendBusy is the back-end's CPU time over the run's duration, in
	// cores: below guestBound the guest side set the pace ("guest-bound").
	BackendBusy *float64 `json:"backend_busy,omitempty"`
	// RatioToPeer is Value over the peer row's Value (vunet rows only).
	RatioToPeer *float64 `json:"ratio_to_peer,omitempty"`
	// CPURatioToPeer is CPUSecPerGB over the peer's (vunet rows only).
	CPURatioToPeer *float64 `json:"cpu_ratio_to_peer,omitempty"`
	Bytes          int64    `json:"bytes,omitempty"`
	// Count is what the value was measured over: round trips, connections
	// made, or idle connections actually held open.
	Count       int      `json:"count,omitempty"`
	LossPercent *float64 `json:"loss_percent,omitempty"`
	Note        string   `json:"note,omitempty"`
	Error       string   `json:"error,omitempty"`
}

// MicroResult is one Go benchmark line.
type MicroResult struct {
	Package     string             `json:"package"`
	Name        string             `json:"name"`
	Iterations  int64              `json:"iterations"`
	NsPerOp     float64            `json:"ns_per_op"`
	BytesPerOp  float64            `json:"bytes_per_op"`
	AllocsPerOp float64            `json:"allocs_per_op"`
	Extra       map[string]float64 `json:"extra,omitempty"` // MB/s and custom metrics
}

// Report is the JSON file.
type Report struct {
	Started  string            `json:"started"`
	Seconds  float64           `json:"seconds"`
	Kernel   string            `json:"kernel"`
	CPUs     int               `json:"cpus"`
	Backends map[string]string `json:"backends"` // name → command template
	Settings map[string]any    `json:"settings"`
	Results  []Result          `json:"results"`
	Micro    []MicroResult     `json:"micro,omitempty"`
	MicroErr string            `json:"micro_error,omitempty"`
	Notes    []string          `json:"notes,omitempty"`
}

func ptr(v float64) *float64 { return &v }
