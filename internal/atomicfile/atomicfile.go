// Package atomicfile writes small state files so that a crash at any moment
// leaves either the old content or the new one, never a torn file: write a
// temporary file in the same directory, fsync it, rename it over the target,
// fsync the directory.
package atomicfile

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// WriteJSON stores v as JSON at path, creating the directory if needed.
func WriteJSON(path string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return Write(path, append(data, '\n'))
}

// Write stores data at path atomically and durably.
func Write(path string, data []byte) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+TempMarker+"*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // no-op after a successful rename
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// TempMarker is part of the name of every temporary file Write makes; a
// file whose name starts with "." and contains it is debris of a write that
// was interrupted, never valid content, and may be removed.
const TempMarker = ".tmp-"

// IsTemp reports whether a file name is such debris.
func IsTemp(name string) bool {
	return strings.HasPrefix(name, ".") && strings.Contains(name, TempMarker)
}

// RemoveTemps removes the debris of interrupted writes in dir.
func RemoveTemps(dir string) {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if IsTemp(e.Name()) && e.Type().IsRegular() {
			_ = os.Remove(filepath.Join(dir, e.Name()))
		}
	}
}

// ErrNotExist is returned by ReadJSON for a missing file.
var ErrNotExist = fs.ErrNotExist

// MaxJSONSize bounds what ReadJSON reads: state files are small, and a
// file that grew (corruption, a mistake) must not make the agent read it
// all into memory.
const MaxJSONSize = 1 << 20

// ReadJSON loads path into v.
func ReadJSON(path string, v any) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxJSONSize+1))
	if err != nil {
		return err
	}
	if len(data) > MaxJSONSize {
		return fmt.Errorf("%s is corrupt: larger than %d bytes", path, MaxJSONSize)
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("%s is corrupt: %w", path, err)
	}
	return nil
}

// Remove deletes path; a missing file is fine.
func Remove(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}
