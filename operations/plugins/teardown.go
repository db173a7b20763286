package plugins

import (
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/volume-agent/volume-agent/operations/mountutil"
)

// maxStackedMounts bounds how many mounts TearDown peels off one path: more
// than one means something mounted twice, which must still be cleaned up.
const maxStackedMounts = 16

// UnmountAll unmounts every mount stacked on path.
func UnmountAll(m *mountutil.Mounter, path string) error {
	for i := 0; i < maxStackedMounts; i++ {
		mounted, err := m.IsMountPoint(path)
		if err != nil {
			return err
		}
		if !mounted {
			return nil
		}
		if err := m.Unmount(path); err != nil {
			return err
		}
	}
	return fmt.Errorf("%s is still a mount point after %d unmounts", path, maxStackedMounts)
}

// UnmountAndRemoveEntry unmounts path and removes the (empty) directory or
// file it was mounted on. It never removes anything below path: whatever is
// there belongs to the volume's source, not to the pod.
func UnmountAndRemoveEntry(m *mountutil.Mounter, path string) error {
	if err := UnmountAll(m, path); err != nil {
		return err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing mount point %s: %w", path, err)
	}
	return nil
}
