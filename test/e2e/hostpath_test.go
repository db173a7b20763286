package e2e

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

// hostPath volumes of every type: the matching ones are bind-mounted into
// the pod (files, sockets and devices onto a file), the mismatching ones fail
// with an error naming the path and what it is, on /debug/operations and as a
// FailedMount event, while the other volumes of the same pods, and the other
// pods, mount.
func TestHostPathTypes(t *testing.T) {
	requireE2E(t)
	t.Parallel()
	// Created before the agent so that they outlive it.
	host := mounttest.TempDir(t)
	loop := mounttest.LoopDevice(t, 16<<20)
	a := newAgent(t)

	dir := filepath.Join(host, "dir")
	mounttest.WriteFile(t, filepath.Join(dir, "host.txt"), "dir content")
	file := filepath.Join(host, "file.txt")
	mounttest.WriteFile(t, file, "file content")
	sock := filepath.Join(host, "app.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	createdDir := filepath.Join(host, "created", "nested")
	createdFile := filepath.Join(host, "created.txt")

	good := []struct {
		name string
		path string
		typ  *corev1.HostPathType
		kind os.FileMode
	}{
		{"unset", dir, nil, os.ModeDir},
		{"dir-or-create", createdDir, hostPathType(corev1.HostPathDirectoryOrCreate), os.ModeDir},
		{"directory", dir, hostPathType(corev1.HostPathDirectory), os.ModeDir},
		{"file-or-create", createdFile, hostPathType(corev1.HostPathFileOrCreate), 0},
		{"file", file, hostPathType(corev1.HostPathFile), 0},
		{"socket", sock, hostPathType(corev1.HostPathSocket), os.ModeSocket},
		{"char-device", "/dev/null", hostPathType(corev1.HostPathCharDev), os.ModeDevice | os.ModeCharDevice},
		{"block-device", loop, hostPathType(corev1.HostPathBlockDev), os.ModeDevice},
	}
	var vols []corev1.Volume
	for _, g := range good {
		vols = append(vols, e2eutil.HostPathVolume(g.name, g.path, g.typ))
	}
	a.Write("good.yaml", newPod("hp-good", vols...))

	bad := []struct {
		pod  string
		path string
		typ  *corev1.HostPathType
		want string // besides the path
	}{
		{"hp-bad-directory", file, hostPathType(corev1.HostPathDirectory), "is not a directory (it is a regular file)"},
		{"hp-bad-dir-or-create", file, hostPathType(corev1.HostPathDirectoryOrCreate), "is not a directory (it is a regular file)"},
		{"hp-bad-file", dir, hostPathType(corev1.HostPathFile), "is not a regular file (it is a directory)"},
		{"hp-bad-file-or-create", dir, hostPathType(corev1.HostPathFileOrCreate), "is not a regular file (it is a directory)"},
		{"hp-bad-file-or-create-parent", filepath.Join(host, "no-parent", "f.txt"), hostPathType(corev1.HostPathFileOrCreate), "no such file or directory"},
		{"hp-bad-socket", file, hostPathType(corev1.HostPathSocket), "is not a socket (it is a regular file)"},
		{"hp-bad-char-device", loop, hostPathType(corev1.HostPathCharDev), "is not a character device (it is a block device)"},
		{"hp-bad-block-device", "/dev/null", hostPathType(corev1.HostPathBlockDev), "is not a block device (it is a character device)"},
		{"hp-bad-missing", filepath.Join(host, "missing"), nil, "no such file or directory"},
	}
	for _, b := range bad {
		a.Write(b.pod+".yaml", newPod(b.pod, e2eutil.HostPathVolume("bad", b.path, b.typ), e2eutil.EmptyDirVolume("ok", corev1.StorageMediumMemory, "1Mi")))
	}
	a.Start()

	uid := a.waitReady("hp-good")["hp-good"]
	for _, g := range good {
		target := a.volumeDir(uid, e2eutil.HostPathPlugin, g.name)
		if _, err := mountAt(t, target); err != nil {
			t.Errorf("%s: %v", g.name, err)
			continue
		}
		fi, err := os.Stat(target)
		if err != nil {
			t.Errorf("%s: %v", g.name, err)
			continue
		}
		if fi.Mode().Type() != g.kind {
			t.Errorf("%s: pod volume is %v, want type %v", g.name, fi.Mode().Type(), g.kind)
		}
		if same, err := sameFile(target, g.path); err != nil || !same {
			t.Errorf("%s: pod volume is not the host path %s (%v)", g.name, g.path, err)
		}
	}
	if got := mounttest.ReadFile(t, filepath.Join(a.volumeDir(uid, e2eutil.HostPathPlugin, "directory"), "host.txt")); got != "dir content" {
		t.Errorf("directory content through the mount: %q", got)
	}
	if got := mounttest.ReadFile(t, a.volumeDir(uid, e2eutil.HostPathPlugin, "file")); got != "file content" {
		t.Errorf("file content through the mount: %q", got)
	}
	if fi, err := os.Stat(createdFile); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("FileOrCreate did not create %s: %v", createdFile, err)
	}

	// Every bad pod: its good volume mounted, its bad one not, and the
	// error on /debug/operations and /debug/events.
	e2eutil.PollErr(t, settleTimeout, "the mismatching hostPath volumes to be reported", func() error {
		d, err := a.DSW()
		if err != nil {
			return err
		}
		ops, err := a.Operations()
		if err != nil {
			return err
		}
		evs, err := a.Events()
		if err != nil {
			return err
		}
		for _, b := range bad {
			p := d.Pod("default", b.pod)
			if p == nil {
				return fmt.Errorf("pod %s not in /debug/dsw", b.pod)
			}
			if p.VolumesReady {
				return fmt.Errorf("pod %s reported ready with a bad hostPath", b.pod)
			}
			if _, err := mountAt(t, a.volumeDir(p.UID, e2eutil.EmptyDirPlugin, "ok")); err != nil {
				return fmt.Errorf("pod %s: the good volume: %v", b.pod, err)
			}
			found := false
			for _, op := range ops.Operations {
				if op.Pod != nil && op.Pod.Name == b.pod && op.Operation == "mount_volume" &&
					op.Volume == e2eutil.HostPathPlugin+"/"+p.UID+"-bad" && e2eutil.ContainsAll(op.LastError, b.path, b.want) {
					found = true
				}
			}
			if !found {
				return fmt.Errorf("pod %s: no mount_volume operation with lastError naming %s and %q in %+v", b.pod, b.path, b.want, ops.Operations)
			}
			found = false
			for _, e := range evs.Events {
				if e.Object.Kind == "Pod" && e.Object.Namespace == "default" && e.Object.Name == b.pod && e.Object.UID == p.UID &&
					e.Type == "Warning" && e.Reason == "FailedMount" && e2eutil.ContainsAll(e.Message, `"bad"`, b.path, b.want) {
					found = true
				}
			}
			if !found {
				return fmt.Errorf("pod %s: no FailedMount event naming volume \"bad\", %s and %q", b.pod, b.path, b.want)
			}
		}
		return nil
	})
	for _, b := range bad {
		uid := a.podUID(b.pod)
		target := a.volumeDir(uid, e2eutil.HostPathPlugin, "bad")
		if ms := mounttest.MountsUnder(t, target); len(ms) != 0 {
			t.Errorf("%s: the bad volume is mounted: %v", b.pod, mounttest.MountPoints(ms))
		}
		if _, err := os.Lstat(target); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: a mount point was created for the bad volume: %v", b.pod, err)
		}
	}
	if _, err := os.Lstat(filepath.Join(host, "no-parent")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("FileOrCreate created the parent directory: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(host, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a missing hostPath of type unset was created: %v", err)
	}
	// The good pod is still fine.
	if ms := mounttest.MountsUnder(t, filepath.Join(a.Root(), "pods", uid)); len(ms) != len(good) {
		t.Errorf("good pod mounts: %v, want %d", mounttest.MountPoints(ms), len(good))
	}
	if fi, err := os.Stat(createdDir); err != nil || !fi.IsDir() {
		t.Errorf("DirectoryOrCreate did not create %s: %v", createdDir, err)
	}
}
