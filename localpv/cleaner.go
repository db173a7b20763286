package localpv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/volume-agent/volume-agent/internal/hostroot"
	"github.com/volume-agent/volume-agent/internal/mountutil"
	"github.com/volume-agent/volume-agent/internal/safefs"
)

// Environment of cleanup commands. LOCAL_PV_BLKDEVICE is the name the
// local static provisioner's cleaner scripts read, so they work unchanged.
const (
	EnvDevice = "LOCAL_PV_BLKDEVICE"
	EnvPV     = "LOCAL_PV_NAME"
	EnvPath   = "LOCAL_PV_PATH"
	EnvClass  = "LOCAL_PV_STORAGE_CLASS"
)

// cleaner cleans one volume's disk.
type cleaner struct {
	root    hostroot.Root
	mounter *mountutil.Mounter
}

// clean empties the disk behind t: the contents of a mounted directory
// (never crossing into another mount, never following a symbolic link), or
// the block device with the class's method. It checks first that the disk
// is still what the PV was made from, and for a device that nothing has
// it mounted: cleaning the wrong thing is worse than not cleaning.
func (c *cleaner) clean(ctx context.Context, t target, class *Class) error {
	ctx, cancel := context.WithTimeout(ctx, class.Timeout)
	defer cancel()
	if !t.Block {
		return c.cleanDir(ctx, t)
	}
	p := (&hostProber{root: c.root, mounter: c.mounter}).probe(t.Path)
	if p.Err != nil {
		return fmt.Errorf("inspecting %s: %w", t.Path, p.Err)
	}
	if p.Kind != KindBlockDevice {
		return fmt.Errorf("%s is not a block device (it is a %s): not cleaning it", t.Path, describe(p))
	}
	if where, err := deviceMountedAt(p.Device); err != nil {
		return err
	} else if where != "" {
		return fmt.Errorf("device %s (%s) is still mounted at %s: not cleaning it while it is in use", p.Device, t.Path, where)
	}
	if ap, err := deviceMappedAt(p.Device); err != nil {
		return err
	} else if ap != "" {
		return fmt.Errorf("device %s (%s) is still mapped for a pod at %s: not cleaning it while it is in use", p.Device, t.Path, ap)
	}
	err := c.cleanDevice(ctx, t, class, p.Device)
	if err != nil && ctx.Err() == context.DeadlineExceeded {
		return fmt.Errorf("%w (cleanup timeout %v)", err, class.Timeout)
	}
	return err
}

func (c *cleaner) cleanDir(ctx context.Context, t target) error {
	dir, err := c.root.ResolveParent(t.Path)
	if err != nil {
		return fmt.Errorf("%s: %w", t.Path, err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("%s: %w", t.Path, err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory: not cleaning it", t.Path)
	}
	// Emptying the directory under an unmounted disk would look like a
	// success while the disk, when it comes back, still holds the data.
	mp, err := c.mounter.IsMountPoint(dir)
	if err != nil {
		return fmt.Errorf("checking that %s is a mount point: %w", t.Path, err)
	}
	if !mp {
		return fmt.Errorf("%s is no longer a mount point: not cleaning it", t.Path)
	}
	if err := safefs.RemoveContents(ctx, dir); err != nil {
		return fmt.Errorf("removing the contents of %s: %w", t.Path, err)
	}
	return nil
}

func (c *cleaner) cleanDevice(ctx context.Context, t target, class *Class, dev string) error {
	switch m := class.Cleanup; m.Method {
	case CleanupWipefs:
		return runCommand(ctx, []string{"wipefs", "--all", dev}, nil)
	case CleanupBlkdiscard:
		return runCommand(ctx, []string{"blkdiscard", dev}, nil)
	case CleanupZero:
		return zeroDevice(ctx, dev, m.ZeroMiB)
	case CleanupCommand:
		env := []string{EnvDevice + "=" + dev, EnvPV + "=" + t.PV, EnvPath + "=" + t.Path, EnvClass + "=" + t.Class}
		return runCommand(ctx, m.Command, env)
	default:
		return fmt.Errorf("unknown cleanup method %q", m.Method)
	}
}

// zeroDevice overwrites the first mib MiB of dev (or all of it, if
// smaller) with zeros: enough to destroy partition tables and filesystem
// superblocks. O_EXCL makes the kernel refuse a device that is mounted or
// held by another exclusive user.
func zeroDevice(ctx context.Context, dev string, mib int64) error {
	f, err := os.OpenFile(dev, os.O_WRONLY|unix.O_EXCL|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	size, err := deviceSize(dev)
	if err != nil {
		return err
	}
	left := min(mib<<20, size)
	buf := make([]byte, 1<<20)
	for left > 0 {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("zeroing %s: %w", dev, err)
		}
		n := min(int64(len(buf)), left)
		if _, err := f.Write(buf[:n]); err != nil {
			return err
		}
		left -= n
	}
	if err := f.Sync(); err != nil {
		return err
	}
	return f.Close()
}

// maxOutput is how much of a command's output an error keeps.
const maxOutput = 2048

// tailBuffer keeps the last maxOutput bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	buf []byte
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if len(b.buf) > maxOutput {
		b.buf = b.buf[len(b.buf)-maxOutput:]
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.TrimSpace(string(bytes.ToValidUTF8(b.buf, nil)))
}

// runCommand runs argv with extra environment variables. It runs in its
// own process group, killed whole when ctx ends (a timeout, or the agent
// stopping), so that no cleaner outlives its cleanup and no two cleaners
// ever work on one device.
func runCommand(ctx context.Context, argv, env []string) error {
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	var out tailBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	if err == nil {
		return nil
	}
	msg := out.String()
	if msg != "" {
		msg = ": " + msg
	}
	var ee *exec.ExitError
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("%s was stopped: %w%s", argv[0], ctx.Err(), msg)
	case errors.As(err, &ee) && ee.Exited():
		return fmt.Errorf("%s exited with status %d%s", strings.Join(argv, " "), ee.ExitCode(), msg)
	}
	return fmt.Errorf("%s: %w%s", strings.Join(argv, " "), err, msg)
}

// deviceMountedAt returns a mount point of the block device dev in this
// mount namespace, "" if it has none.
// deviceMappedAt returns the access point of a pod that has the block
// device dev mapped as a raw block volume, if any: the backing file of a
// loop device that pins it (the agent's pins, and the kubelet's, are loop
// devices backed by a pod's bind mount of the device). A bind mount of a
// device node does not show the device in the mount table, so
// deviceMountedAt cannot see these.
func deviceMappedAt(dev string) (string, error) {
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil {
		return "", &os.PathError{Op: "stat", Path: dev, Err: err}
	}
	loops, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, f := range loops {
		raw, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		backing := strings.TrimSuffix(strings.TrimSpace(string(raw)), " (deleted)")
		var bst unix.Stat_t
		if unix.Stat(backing, &bst) == nil && bst.Mode&unix.S_IFMT == unix.S_IFBLK && bst.Rdev == st.Rdev {
			return backing, nil
		}
	}
	return "", nil
}

func deviceMountedAt(dev string) (string, error) {
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil {
		return "", &os.PathError{Op: "stat", Path: dev, Err: err}
	}
	want := fmt.Sprintf("%d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev))
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && f[2] == want {
			return unescapeOctal(f[4]), nil
		}
	}
	return "", nil
}

// unescapeOctal decodes mountinfo's \040-style escapes.
func unescapeOctal(s string) string {
	return strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`).Replace(s)
}
