package localpv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
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
	root       hostroot.Root
	mounter    *mountutil.Mounter
	identifier identifier
}

// Results of the identity check before a cleanup, for the metric.
const (
	identityMatch      = "match"
	identityMismatch   = "mismatch"
	identityUnrecorded = "unrecorded"
)

// clean empties the disk behind t: the contents of a mounted directory
// (never crossing into another mount, never following a symbolic link), or
// the block device with the class's method. It checks first that the disk
// is the one the PV was made from (its recorded identity; a
// *DiskMismatchError otherwise), that it is still a mount point or a block
// device, and that nothing else uses it: cleaning the wrong thing is worse
// than not cleaning. It returns how the identity check went ("" if it did
// not get that far).
func (c *cleaner) clean(ctx context.Context, t target, class *Class) (identity string, err error) {
	ctx, cancel := context.WithTimeout(ctx, class.Timeout)
	defer cancel()
	if identity, err = c.checkIdentity(ctx, t); err != nil {
		return identity, err
	}
	if !t.Block {
		return identity, c.cleanDir(ctx, t)
	}
	p := (&hostProber{root: c.root, mounter: c.mounter}).probe(t.Path)
	if p.Err != nil {
		return identity, fmt.Errorf("inspecting %s: %w", t.Path, p.Err)
	}
	if p.Kind != KindBlockDevice {
		return identity, fmt.Errorf("%s is not a block device (it is a %s): not cleaning it", t.Path, describe(p))
	}
	if users, err := blockDeviceUsers(p.Device); err != nil {
		return identity, err
	} else if users != "" {
		return identity, fmt.Errorf("device %s (%s) is in use: %s; not cleaning it while it is", p.Device, t.Path, users)
	}
	err = c.cleanDevice(ctx, t, class, p.Device)
	if err != nil && ctx.Err() == context.DeadlineExceeded {
		return identity, fmt.Errorf("%w (cleanup timeout %v)", err, class.Timeout)
	}
	return identity, err
}

// checkIdentity compares the disk at t's path with the identity recorded
// when its PV was made. A PV without one (made before identities were
// recorded, or by hand with the provisioner's annotation) is cleaned as
// before, with the other checks only.
func (c *cleaner) checkIdentity(ctx context.Context, t target) (string, error) {
	if t.Identity.IsZero() {
		return identityUnrecorded, nil
	}
	current, err := c.identifier.identify(ctx, t.Path, t.Block)
	if err != nil {
		return "", fmt.Errorf("identifying the disk at %s: %w", t.Path, err)
	}
	if same, why := sameDisk(t.Identity, current); !same {
		return identityMismatch, &DiskMismatchError{Path: t.Path, Recorded: t.Identity, Current: current, Why: why}
	}
	return identityMatch, nil
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
	if users, err := directoryUsers(dir); err != nil {
		return fmt.Errorf("checking whether %s is in use: %w", t.Path, err)
	} else if users != "" {
		return fmt.Errorf("%s is in use: %s; not cleaning it while it is", t.Path, users)
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
