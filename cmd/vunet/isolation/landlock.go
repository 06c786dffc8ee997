package isolation

import (
	"fmt"
	"path/filepath"
	"strconv"

	"github.com/landlock-lsm/go-landlock/landlock"
	ll "github.com/landlock-lsm/go-landlock/landlock/syscall"
)

// File-system isolation is Landlock rather than a mount namespace with
// pivot_root (passt's way): Landlock needs no privilege, so an
// unprivileged daemon (libvirt starts passt that way) is confined too;
// it needs no re-exec to unshare namespaces from a multi-threaded Go
// process; and it leaves the descriptors opened before it (log, pcap,
// guest memory, sockets) fully usable, including ftruncate of the log.
// Where the kernel lacks Landlock the start-up line says so.

// landlockConfig handles every file-system right go-landlock knows; best
// effort narrows it to what the running kernel supports.
var landlockConfig = landlock.V11.BestEffort()

// landlockABI is the running kernel's Landlock ABI version, 0 without
// Landlock.
func landlockABI() int {
	v, err := ll.LandlockGetABIVersion()
	if err != nil {
		return 0
	}
	return v
}

// restrictDaemonPaths leaves the daemon no host path at all, except, with
// --metrics, reading its own /proc entry and /proc/stat (the Prometheus
// process collector: CPU, memory, descriptors, start time).
func restrictDaemonPaths(pid int, metrics bool) error {
	var rules []landlock.Rule
	if metrics {
		rules = append(rules,
			landlock.PathAccess(ll.AccessFSReadFile|ll.AccessFSReadDir, "/proc/"+strconv.Itoa(pid)),
			landlock.PathAccess(ll.AccessFSReadFile, "/proc/stat"))
	}
	if err := landlockConfig.RestrictPaths(rules...); err != nil {
		return fmt.Errorf("landlock: %w", err)
	}
	return nil
}

// restrictKeeperPaths leaves the keeper the removal of files in the
// directories of the files it removes at exit and, where the kernel
// governs it, connecting to sockets in the --connect socket's directory.
func restrictKeeperPaths(remove []string, connect string) error {
	var rules []landlock.Rule
	seen := map[string]bool{}
	for _, p := range remove {
		d := filepath.Dir(p)
		if !seen[d] {
			seen[d] = true
			rules = append(rules, landlock.PathAccess(ll.AccessFSRemoveFile, d).IgnoreIfMissing())
		}
	}
	if connect != "" {
		rules = append(rules, landlock.PathAccess(ll.AccessFSResolveUnix, filepath.Dir(connect)).IgnoreIfMissing())
	}
	if err := landlockConfig.RestrictPaths(rules...); err != nil {
		return fmt.Errorf("landlock: %w", err)
	}
	return nil
}
