package plugins

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
)

// UnmountAndRemoveEntry unmounts path and removes the (empty) directory or
// file it was mounted on. It never removes anything below path: whatever is
// there belongs to the volume's source, not to the pod.
func UnmountAndRemoveEntry(m Mounter, path string) error {
	if err := m.UnmountAll(path); err != nil {
		return err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing mount point %s: %w", path, err)
	}
	return nil
}
