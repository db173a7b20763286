package plugins

import (
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	v1 "k8s.io/api/core/v1"

	"github.com/volume-agent/volume-agent/volume"
)

// ApplyFSGroup gives the pod's fsGroup access to the volume at dir, the way
// the kubelet does: group ownership, group read/write (read for read-only
// volumes) and setgid on directories so new files inherit the group. With
// the OnRootMismatch policy an already-correct root means nothing is walked,
// which is what keeps large volumes fast to mount.
func ApplyFSGroup(dir string, pod volume.PodInfo, readOnly bool) error {
	if pod.FSGroup == nil {
		return nil
	}
	gid := int(*pod.FSGroup)
	fileMode := os.FileMode(0o660)
	if readOnly {
		fileMode = 0o440
	}
	dirMode := fileMode | 0o110 | os.ModeSetgid

	if pod.FSGroupChangePolicy != nil && *pod.FSGroupChangePolicy == v1.FSGroupChangeOnRootMismatch {
		if rootMatches(dir, gid, dirMode) {
			return nil
		}
	}
	return filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := os.Lchown(path, -1, gid); err != nil {
			return err
		}
		if d.Type()&fs.ModeSymlink != 0 {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		want := info.Mode() | fileMode
		if d.IsDir() {
			want |= dirMode
		}
		if want == info.Mode() {
			return nil
		}
		return os.Chmod(path, want&(os.ModePerm|os.ModeSetgid|os.ModeSetuid|os.ModeSticky))
	})
}

func rootMatches(dir string, gid int, want os.FileMode) bool {
	info, err := os.Stat(dir)
	if err != nil {
		return false
	}
	st, ok := info.Sys().(*syscall.Stat_t)
	return ok && int(st.Gid) == gid && info.Mode()&want == want
}
