package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// childArg makes the program the container side: it builds the
// container's root directory in the mount namespace it was started in and
// runs the container's command there.
const childArg = "__container"

// containerSpec is what the container side is told, as JSON on fd 3.
type containerSpec struct {
	// Root is an empty directory to build the container's root on.
	Root       string   `json:"root"`
	Mounts     []bind   `json:"mounts"`
	Command    []string `json:"command"`
	Env        []string `json:"env"`
	WorkingDir string   `json:"workingDir"`
	Hostname   string   `json:"hostname"`
}

// bind is a host path (a volume, a sub-path, a block device) to mount in
// the container.
type bind struct {
	Source   string `json:"source"`
	Target   string `json:"target"`
	ReadOnly bool   `json:"readOnly"`
	// Image: an unpacked image at Source (an image volume), mounted
	// read-only, nosuid and nodev; ImageSubPath is resolved inside it.
	Image        bool   `json:"image,omitempty"`
	ImageSubPath string `json:"imageSubPath,omitempty"`
}

func writeSpec(w io.Writer, s *containerSpec) error { return json.NewEncoder(w).Encode(s) }

func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
}

// hostDirs are what the container takes from the host to run its command:
// links as they are, directories through a writable overlay (so that a
// volume can be mounted anywhere below them without touching the host).
var hostDirs = []string{"bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr", "etc"}

// devices are the host's device nodes every container gets.
var devices = []string{"null", "zero", "full", "random", "urandom", "tty"}

// runChild runs in a new, private mount namespace (CLONE_NEWNS): nothing it
// mounts is seen outside, and all of it goes away with the container.
func runChild() error {
	spec, err := readSpec()
	if err != nil {
		return err
	}
	// <Root> is a tmpfs holding rootfs/ (the container's /) and overlay/
	// (the writable layers of the host directories).
	if err := unix.Mount("tmpfs", spec.Root, "tmpfs", unix.MS_NOSUID, "mode=0755"); err != nil {
		return fmt.Errorf("mounting the container's tmpfs: %w", err)
	}
	rootfs := filepath.Join(spec.Root, "rootfs")
	for _, d := range []string{rootfs, filepath.Join(rootfs, "dev"), filepath.Join(rootfs, "proc"), filepath.Join(rootfs, "tmp")} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return err
		}
	}
	if err := os.Chmod(filepath.Join(rootfs, "tmp"), 0o1777); err != nil {
		return err
	}
	for _, d := range hostDirs {
		if err := takeHostDir(spec.Root, rootfs, d); err != nil {
			return err
		}
	}
	for _, d := range devices {
		src := "/dev/" + d
		if _, err := os.Stat(src); err != nil {
			continue
		}
		dst := filepath.Join(rootfs, "dev", d)
		if err := os.WriteFile(dst, nil, 0o666); err != nil {
			return err
		}
		if err := unix.Mount(src, dst, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("binding %s: %w", src, err)
		}
	}
	if err := unix.Mount("proc", filepath.Join(rootfs, "proc"), "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mounting /proc: %w", err)
	}

	// The volumes' host paths are opened before entering the container's
	// root and mounted from the descriptors after: every path inside the
	// root is resolved inside it, so a link in the container's tree can
	// never make a mount point land on the host.
	mounts := append([]bind(nil), spec.Mounts...)
	sort.SliceStable(mounts, func(i, j int) bool { return depth(mounts[i].Target) < depth(mounts[j].Target) })
	fds := make([]int, len(mounts))
	for i, m := range mounts {
		var fd int
		if m.Image {
			fd, err = openInImage(m.Source, m.ImageSubPath)
		} else {
			fd, err = unix.Open(m.Source, unix.O_PATH|unix.O_CLOEXEC, 0)
		}
		if err != nil {
			return fmt.Errorf("opening %s for %s: %w", m.Source, m.Target, err)
		}
		fds[i] = fd
	}
	if err := unix.Chroot(rootfs); err != nil {
		return err
	}
	if err := os.Chdir("/"); err != nil {
		return err
	}
	for i, m := range mounts {
		if err := mountFd(fds[i], m); err != nil {
			return err
		}
		unix.Close(fds[i])
	}

	for _, kv := range spec.Env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			os.Setenv("PATH", v)
		}
	}
	if spec.WorkingDir != "" {
		if err := os.MkdirAll(spec.WorkingDir, 0o755); err != nil {
			return err
		}
		if err := os.Chdir(spec.WorkingDir); err != nil {
			return err
		}
	}
	path, err := exec.LookPath(spec.Command[0])
	if err != nil {
		return err
	}
	return syscall.Exec(path, spec.Command, spec.Env)
}

func readSpec() (*containerSpec, error) {
	f := os.NewFile(3, "spec")
	defer f.Close()
	var s containerSpec
	if err := json.NewDecoder(f).Decode(&s); err != nil {
		return nil, fmt.Errorf("reading the container's spec: %w", err)
	}
	if s.Root == "" || len(s.Command) == 0 {
		return nil, errors.New("the container's spec has no root or no command")
	}
	return &s, nil
}

// takeHostDir gives the container the host's /<d>: the same link, or an
// overlay of the directory with a writable layer on the tmpfs.
func takeHostDir(tmp, rootfs, d string) error {
	host := "/" + d
	fi, err := os.Lstat(host)
	if err != nil {
		return nil // the host has none
	}
	target := filepath.Join(rootfs, d)
	if fi.Mode()&os.ModeSymlink != 0 {
		link, err := os.Readlink(host)
		if err != nil {
			return err
		}
		return os.Symlink(link, target)
	}
	if !fi.IsDir() {
		return nil
	}
	upper, work := filepath.Join(tmp, "overlay", d, "upper"), filepath.Join(tmp, "overlay", d, "work")
	for _, dir := range []string{target, upper, work} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	opts := "lowerdir=" + host + ",upperdir=" + upper + ",workdir=" + work
	if err := unix.Mount("overlay", target, "overlay", 0, opts); err == nil {
		return nil
	}
	// No overlayfs: the host's directory read-only; volumes can then only
	// be mounted at paths that exist in it.
	if err := unix.Mount(host, target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("binding %s: %w", host, err)
	}
	return unix.Mount("", target, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, "")
}

// mountFd mounts what fd refers to at m.Target, inside the container's
// root (the current root), read-only if asked, recursively like a CRI
// runtime's rbind.
func mountFd(fd int, m bind) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	target := filepath.Clean("/" + m.Target)
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		if err := os.MkdirAll(target, 0o755); err != nil {
			return fmt.Errorf("making the mount point %s: %w", target, err)
		}
	} else {
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			return fmt.Errorf("making the mount point %s: %w", target, err)
		}
		f, err := os.OpenFile(target, os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			return fmt.Errorf("making the mount point %s: %w", target, err)
		}
		f.Close()
	}
	src := "/proc/self/fd/" + strconv.Itoa(fd)
	if err := unix.Mount(src, target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("mounting %s at %s: %w", m.Source, target, err)
	}
	if !m.ReadOnly {
		return nil
	}
	attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY}
	if m.Image {
		attr.Attr_set |= unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV
	}
	if err := unix.MountSetattr(-1, target, unix.AT_RECURSIVE, attr); err != nil {
		return fmt.Errorf("making %s read-only: %w", target, err)
	}
	return nil
}

func depth(p string) int { return strings.Count(filepath.Clean("/"+p), "/") }
