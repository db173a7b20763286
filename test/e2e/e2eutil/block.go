package e2eutil

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
)

// DevicePath is a raw block volume's access point for a pod: the file the
// agent (or the CSI driver) bind-mounts the block device onto.
func DevicePath(root, podUID, plugin, specName string) string {
	return filepath.Join(PodDir(root, podUID), "volumeDevices", escape(plugin), specName)
}

// AsBlock gives PVs and PVCs volumeMode Block.
func AsBlock(objs ...any) {
	block := corev1.PersistentVolumeBlock
	for _, o := range objs {
		switch o := o.(type) {
		case *corev1.PersistentVolume:
			o.Spec.VolumeMode = &block
		case *corev1.PersistentVolumeClaim:
			o.Spec.VolumeMode = &block
		}
	}
}

// DevicePod is a pod whose container uses every volume in volumeDevices.
func DevicePod(namespace, node, name string, vols ...corev1.Volume) *corev1.Pod {
	p := Pod(namespace, node, name, vols...)
	c := &p.Spec.Containers[0]
	for _, m := range c.VolumeMounts {
		c.VolumeDevices = append(c.VolumeDevices, corev1.VolumeDevice{Name: m.Name, DevicePath: "/dev/xvd-" + m.Name})
	}
	c.VolumeMounts = nil
	return p
}

// Rdev returns the device number of the block device at path (following
// a bind mount, not a symlink), or an error if it is not one.
func Rdev(path string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return 0, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFBLK {
		return 0, fmt.Errorf("%s is not a block device (mode %o)", path, st.Mode)
	}
	return st.Rdev, nil
}

// Pins returns the read-only loop devices (the agent's pins) whose backing
// file is below dir, by backing file.
func Pins(t testing.TB, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	entries, err := os.ReadDir("/sys/block")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), "loop") {
			continue
		}
		back, err := os.ReadFile(filepath.Join("/sys/block", e.Name(), "loop", "backing_file"))
		if err != nil {
			continue
		}
		ro, _ := os.ReadFile(filepath.Join("/sys/block", e.Name(), "ro"))
		file := strings.TrimSuffix(strings.TrimSpace(string(back)), " (deleted)")
		if strings.TrimSpace(string(ro)) == "1" && strings.HasPrefix(file, dir+"/") {
			out[file] = "/dev/" + e.Name()
		}
	}
	return out
}

// RandomHead fills the first n bytes of dev with random data and returns
// them, so a test can tell later that nothing wrote there.
func RandomHead(t testing.TB, dev string, n int) []byte {
	t.Helper()
	head := make([]byte, n)
	if _, err := rand.Read(head); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dev, head, 0); err != nil {
		t.Fatal(err)
	}
	return head
}

// ReadAt reads n bytes of path at off.
func ReadAt(path string, off int64, n int) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	buf := make([]byte, n)
	_, err = f.ReadAt(buf, off)
	return buf, err
}

// WriteAt writes data to path at off and syncs it.
func WriteAt(path string, off int64, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := f.WriteAt(data, off); err != nil {
		return err
	}
	return f.Sync()
}

// SameHead reports whether dev still starts with head.
func SameHead(dev string, head []byte) (bool, error) {
	got, err := ReadAt(dev, 0, len(head))
	return bytes.Equal(got, head), err
}
