//go:build !vunetfault

package hostsock

const faultsEnabled = false

func injectedFault(faultOp) error { return nil }
