package initramfs

import (
	"fmt"
	"io"
)

// newcWriter writes the "new ASCII" cpio format the kernel unpacks as
// initramfs. The standard library has no cpio writer, and the format is a
// fixed 110-byte hex header, the NUL-terminated name and the data, each
// padded to 4 bytes.
type newcWriter struct {
	w   io.Writer
	ino uint32
	err error
}

const (
	modeDir  = 0o040000
	modeFile = 0o100000
	modeLink = 0o120000
	modeChr  = 0o020000
)

func (c *newcWriter) entry(name string, mode uint32, nlink uint32, rdevMajor, rdevMinor uint32, data []byte) {
	if c.err != nil {
		return
	}
	c.ino++
	hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		c.ino, mode, 0, 0, nlink, 0, len(data), 0, 0, rdevMajor, rdevMinor, len(name)+1, 0)
	buf := make([]byte, 0, len(hdr)+len(name)+8)
	buf = append(buf, hdr...)
	buf = append(buf, name...)
	buf = append(buf, 0)
	buf = pad4(buf)
	if _, err := c.w.Write(buf); err != nil {
		c.err = fmt.Errorf("cpio header of %s: %w", name, err)
		return
	}
	if len(data) == 0 {
		return
	}
	if _, err := c.w.Write(data); err != nil {
		c.err = fmt.Errorf("cpio data of %s: %w", name, err)
		return
	}
	if p := (4 - len(data)%4) % 4; p > 0 {
		if _, err := c.w.Write(make([]byte, p)); err != nil {
			c.err = fmt.Errorf("cpio padding of %s: %w", name, err)
		}
	}
}

func pad4(b []byte) []byte {
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

func (c *newcWriter) dir(name string) { c.entry(name, modeDir|0o755, 2, 0, 0, nil) }

func (c *newcWriter) file(name string, perm uint32, data []byte) {
	c.entry(name, modeFile|perm, 1, 0, 0, data)
}

func (c *newcWriter) symlink(name, target string) {
	c.entry(name, modeLink|0o777, 1, 0, 0, []byte(target))
}

func (c *newcWriter) charDev(name string, perm, major, minor uint32) {
	c.entry(name, modeChr|perm, 1, major, minor, nil)
}

// close writes the trailer; the archive is incomplete without it.
func (c *newcWriter) close() error {
	c.entry("TRAILER!!!", 0, 1, 0, 0, nil)
	return c.err
}
