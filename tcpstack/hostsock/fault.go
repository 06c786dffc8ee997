package hostsock

// Error injection for tests: a build with the vunetfault tag can make
// chosen system calls of this package fail with a chosen error, to test
// what the data path does with host errors that are hard to provoke from
// a real kernel (ENOBUFS on sendmsg, EAGAIN on a peek at an urgent mark
// with a signal pending). Without the tag, faultsEnabled is a
// false constant and every check compiles away: production code pays
// nothing, not even a branch.

// faultOp is a system call errors can be injected into.
type faultOp uint8

const (
	faultSend faultOp = iota // sendmsg (IO.Send)
	faultPeek                // recvmsg with MSG_PEEK (IO.Peek)
	numFaultOps
)
