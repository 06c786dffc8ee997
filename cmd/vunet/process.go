package main

import (
	"errors"
	"fmt"
	"os"
	"os/user"
	"strconv"
	"strings"
	"syscall"
)

// writePIDFile writes our PID to path, replacing a stale file; the caller
// removes it at exit.
func writePIDFile(path string) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		return fmt.Errorf("--pid %s: %w", path, err)
	}
	// rename, so a reader never sees a partial file.
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("--pid %s: %w", path, err)
	}
	return nil
}

// lookupRunAs resolves passt's --runas forms: UID, UID:GID, LOGIN,
// LOGIN:GROUP. Without a group, the user's primary group is taken.
func lookupRunAs(spec string) (uid, gid int, err error) {
	name, group, hasGroup := strings.Cut(spec, ":")
	if name == "" || hasGroup && group == "" {
		return 0, 0, fmt.Errorf("--runas %q: want UID, UID:GID, LOGIN or LOGIN:GROUP", spec)
	}
	gid = -1
	if n, err := strconv.Atoi(name); err == nil && n >= 0 {
		uid = n
		if u, err := user.LookupId(name); err == nil {
			gid, _ = strconv.Atoi(u.Gid)
		}
	} else {
		u, err := user.Lookup(name)
		if err != nil {
			return 0, 0, fmt.Errorf("--runas %q: %w", spec, err)
		}
		uid, _ = strconv.Atoi(u.Uid)
		gid, _ = strconv.Atoi(u.Gid)
	}
	if hasGroup {
		if n, err := strconv.Atoi(group); err == nil && n >= 0 {
			gid = n
		} else {
			g, err := user.LookupGroup(group)
			if err != nil {
				return 0, 0, fmt.Errorf("--runas %q: %w", spec, err)
			}
			gid, _ = strconv.Atoi(g.Gid)
		}
	}
	if gid < 0 {
		gid = uid // a numeric UID unknown to the user database: passt does the same
	}
	return uid, gid, nil
}

// dropPrivileges switches every thread to the --runas user (Go's
// syscall.Setuid applies to all threads since Go 1.16).
func dropPrivileges(spec string) error {
	uid, gid, err := lookupRunAs(spec)
	if err != nil {
		return err
	}
	if os.Geteuid() == uid && os.Getegid() == gid {
		return nil
	}
	if err := syscall.Setgroups(nil); err != nil && !errors.Is(err, syscall.EPERM) {
		return fmt.Errorf("--runas %s: setgroups: %w", spec, err)
	}
	if err := syscall.Setgid(gid); err != nil {
		return fmt.Errorf("--runas %s: setgid %d: %w", spec, gid, err)
	}
	if err := syscall.Setuid(uid); err != nil {
		return fmt.Errorf("--runas %s: setuid %d: %w", spec, uid, err)
	}
	return nil
}
