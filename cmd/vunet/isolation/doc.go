// Package isolation confines the vunet daemon once start-up is done, the
// way passt's isolation.c does, in Go: a dropped user with no
// capabilities, no_new_privs, not dumpable, Landlock for the file system
// and a seccomp allow-list on every thread, plus a small keeper process
// that answers and reports the filter's misses, dials --connect sockets
// and removes the daemon's files at exit (keeper_main.go says why).
package isolation
