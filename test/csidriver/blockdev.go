package csidriver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// commandTimeout bounds every external command. Commands deliberately do not
// use the gRPC request's context: a mkfs killed halfway because the caller
// gave up would leave a half-written filesystem that the next attempt could
// not tell from a real one.
const commandTimeout = 2 * time.Minute

// cmdError is a failed external command with its output.
type cmdError struct {
	cmd    string
	output string
	code   int // exit code, -1 when it did not run or was killed
	err    error
}

func (e *cmdError) Error() string {
	if e.output == "" {
		return fmt.Sprintf("%s: %v", e.cmd, e.err)
	}
	return fmt.Sprintf("%s: %v: %s", e.cmd, e.err, e.output)
}

func (e *cmdError) Unwrap() error { return e.err }

// run executes a command and returns its trimmed stdout. Stdin is empty, so
// a tool that wants to ask a question (mke2fs on a device that already has a
// filesystem) gets no answer and gives up.
func run(name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), commandTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		code := -1
		var exitErr *exec.ExitError
		if errors.As(err, &exitErr) {
			code = exitErr.ExitCode()
		}
		out := strings.TrimSpace(stderr.String() + "\n" + stdout.String())
		return "", &cmdError{cmd: name + " " + strings.Join(args, " "), output: out, code: code, err: err}
	}
	return strings.TrimSpace(stdout.String()), nil
}

func exitCode(err error) int {
	var ce *cmdError
	if errors.As(err, &ce) {
		return ce.code
	}
	return -1
}

// loopSysDir is the sysfs directory of a loop device such as /dev/loop3.
func loopSysDir(dev string) string {
	return filepath.Join("/sys/block", filepath.Base(dev))
}

// loopBackingFile returns the file attached to a loop device, or "" if the
// device is not attached (or does not exist).
func loopBackingFile(dev string) string {
	data, err := os.ReadFile(filepath.Join(loopSysDir(dev), "loop", "backing_file"))
	if err != nil {
		return ""
	}
	return strings.TrimSuffix(strings.TrimSpace(string(data)), " (deleted)")
}

// findLoop returns the loop device that file is attached to, or "".
func findLoop(file string) string {
	entries, _ := filepath.Glob("/sys/block/loop*")
	for _, e := range entries {
		dev := "/dev/" + filepath.Base(e)
		if loopBackingFile(dev) == file {
			return dev
		}
	}
	return ""
}

// attachLoop attaches file to a free loop device, or returns the device it
// is already attached to: a driver that crashed between attaching and
// saving its state must not attach the file a second time.
func attachLoop(file string) (string, error) {
	if dev := findLoop(file); dev != "" {
		return dev, nil
	}
	dev, err := run("losetup", "--find", "--show", file)
	if err != nil {
		return "", err
	}
	if !strings.HasPrefix(dev, "/dev/loop") {
		return "", fmt.Errorf("losetup returned unexpected device %q", dev)
	}
	return dev, nil
}

// detachLoop detaches dev if it still holds file. If the filesystem on it is
// still mounted the kernel detaches it once it is unmounted.
func detachLoop(dev, file string) error {
	if dev == "" || loopBackingFile(dev) != file {
		return nil
	}
	if _, err := run("losetup", "--detach", dev); err != nil && loopBackingFile(dev) == file {
		return err
	}
	return nil
}

// refreshLoopCapacity makes the loop device pick up a grown backing file.
func refreshLoopCapacity(dev string) error {
	_, err := run("losetup", "--set-capacity", dev)
	return err
}

// deviceSize returns the size of a block device in bytes.
func deviceSize(dev string) (int64, error) {
	data, err := os.ReadFile(filepath.Join(loopSysDir(dev), "size"))
	if err != nil {
		return 0, err
	}
	sectors, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("size of %s: %w", dev, err)
	}
	return sectors * 512, nil
}

// deviceMajorMinor returns "MAJOR:MINOR" of a loop device.
func deviceMajorMinor(dev string) (string, error) {
	data, err := os.ReadFile(filepath.Join(loopSysDir(dev), "dev"))
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(data)), nil
}

// supportedFSTypes are the filesystems NodeStageVolume can create.
var supportedFSTypes = map[string]bool{"ext2": true, "ext3": true, "ext4": true, "xfs": true}

func isExtFS(fsType string) bool { return strings.HasPrefix(fsType, "ext") }

// detectFS returns the filesystem type on dev, or "" for a blank device.
func detectFS(dev string) (string, error) {
	// blkid says "nothing found" for a missing device too.
	if _, err := os.Stat(dev); err != nil {
		return "", err
	}
	out, err := run("blkid", "--probe", "--match-tag", "TYPE", "--output", "value", dev)
	if err != nil {
		if exitCode(err) == 2 { // blkid: nothing found
			return "", nil
		}
		return "", err
	}
	return out, nil
}

// makeFS creates a filesystem on a blank device. Neither mkfs is forced: if
// they find a signature blkid missed, they refuse instead of overwriting it.
func makeFS(dev, fsType string) error {
	var err error
	switch {
	case isExtFS(fsType):
		_, err = run("mkfs."+fsType, "-q", dev)
	case fsType == "xfs":
		_, err = run("mkfs.xfs", "-q", dev)
	default:
		err = fmt.Errorf("unsupported filesystem type %q", fsType)
	}
	return err
}

// extFSSize returns the size in bytes of the ext filesystem on dev.
func extFSSize(dev string) (int64, error) {
	out, err := run("dumpe2fs", "-h", dev)
	if err != nil {
		return 0, err
	}
	var blocks, blockSize int64
	for _, line := range strings.Split(out, "\n") {
		key, value, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(value), 10, 64)
		if err != nil {
			continue
		}
		switch strings.TrimSpace(key) {
		case "Block count":
			blocks = n
		case "Block size":
			blockSize = n
		}
	}
	if blocks == 0 || blockSize == 0 {
		return 0, fmt.Errorf("dumpe2fs %s: no block count or size in its output", dev)
	}
	return blocks * blockSize, nil
}

// growExtOffline grows an unmounted ext filesystem to fill its device. It is
// how this driver expands ext volumes at all where the kernel refuses online
// resizing (no CAP_SYS_RESOURCE): the next NodeStageVolume after a
// ControllerExpandVolume grows the filesystem before mounting it.
func growExtOffline(dev string) error {
	fsSize, err := extFSSize(dev)
	if err != nil {
		return err
	}
	devSize, err := deviceSize(dev)
	if err != nil {
		return err
	}
	if fsSize >= devSize {
		return nil
	}
	// resize2fs insists on a freshly checked filesystem. e2fsck -p exits with
	// 1 when it fixed something, which is fine here.
	if _, err := run("e2fsck", "-f", "-p", dev); err != nil && exitCode(err) != 1 {
		return err
	}
	_, err = run("resize2fs", dev)
	return err
}

// errOnlineResizeRefused marks a refused online resize of an ext filesystem.
var errOnlineResizeRefused = errors.New("the kernel refused to grow the mounted filesystem")

// growFSOnline grows the mounted filesystem on dev (mounted at mountPoint)
// to fill the device.
func growFSOnline(dev, fsType, mountPoint string) error {
	switch {
	case isExtFS(fsType):
		_, err := run("resize2fs", dev)
		var ce *cmdError
		if errors.As(err, &ce) && strings.Contains(ce.output, "Permission denied") {
			// Online ext4 resizing needs CAP_SYS_RESOURCE, which sandboxes
			// tend to drop. Say so plainly instead of dumping resize2fs's
			// whole output.
			return fmt.Errorf("%w: resize2fs %s: permission denied (online ext resize needs CAP_SYS_RESOURCE); unstage and stage the volume again to grow it offline",
				errOnlineResizeRefused, dev)
		}
		return err
	case fsType == "xfs":
		_, err := run("xfs_growfs", mountPoint)
		return err
	default:
		return fmt.Errorf("cannot grow filesystem type %q", fsType)
	}
}
