package csidriver

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
)

// stateVersion is bumped when the state file's layout changes incompatibly.
const stateVersion = 1

// stateFile is what the driver keeps in <state-dir>/state.json.
type stateFile struct {
	Version int                `json:"version"`
	Volumes map[string]*volume `json:"volumes"`
}

// volume is everything the driver knows about one volume. Values handed out
// by the store are copies: change one and put it back with driver.putVolume.
type volume struct {
	ID            string            `json:"id"`
	Name          string            `json:"name,omitempty"`
	CapacityBytes int64             `json:"capacityBytes"`
	BackingFile   string            `json:"backingFile"` // relative to <state-dir>/volumes
	Ephemeral     bool              `json:"ephemeral,omitempty"`
	Parameters    map[string]string `json:"parameters,omitempty"`

	// Attachments are ControllerPublishVolume records, by node ID.
	Attachments map[string]attachment `json:"attachments,omitempty"`

	// LoopDevice is the loop device the backing file is attached to on this
	// node, empty when detached.
	LoopDevice string `json:"loopDevice,omitempty"`
	// Staged is set between NodeStageVolume and NodeUnstageVolume.
	Staged *stageInfo `json:"staged,omitempty"`
	// Publications are NodePublishVolume records, by target path.
	Publications map[string]publication `json:"publications,omitempty"`
}

type attachment struct {
	ReadOnly bool `json:"readOnly,omitempty"`
}

type stageInfo struct {
	Path       string   `json:"path"`
	Block      bool     `json:"block,omitempty"`
	FSType     string   `json:"fsType,omitempty"`
	MountFlags []string `json:"mountFlags,omitempty"`
	ReadOnly   bool     `json:"readOnly,omitempty"`
}

type publication struct {
	Block    bool `json:"block,omitempty"`
	ReadOnly bool `json:"readOnly,omitempty"`
	// SingleWriter is set for SINGLE_NODE_SINGLE_WRITER publications, which
	// exclude any other publication of the volume.
	SingleWriter bool `json:"singleWriter,omitempty"`
}

func (v *volume) clone() *volume {
	c := *v
	c.Parameters = maps.Clone(v.Parameters)
	c.Attachments = maps.Clone(v.Attachments)
	c.Publications = maps.Clone(v.Publications)
	if v.Staged != nil {
		s := *v.Staged
		s.MountFlags = append([]string(nil), v.Staged.MountFlags...)
		c.Staged = &s
	}
	return &c
}

func loadState(path string) (*stateFile, error) {
	st := &stateFile{Version: stateVersion, Volumes: map[string]*volume{}}
	data, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return st, nil
	}
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(data, st); err != nil {
		return nil, fmt.Errorf("state file %s: %w", path, err)
	}
	if st.Version != stateVersion {
		return nil, fmt.Errorf("state file %s has version %d, want %d", path, st.Version, stateVersion)
	}
	if st.Volumes == nil {
		st.Volumes = map[string]*volume{}
	}
	return st, nil
}

func saveState(path string, st *stateFile) error {
	data, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(path, append(data, '\n'))
}

// writeFileAtomic replaces path with data so that a reader (or a driver
// restarted after kill -9) sees either the old or the new content, never a
// torn file. It does not fsync: surviving the process is enough for tests,
// surviving a power cut is not needed.
func writeFileAtomic(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp, 0o644)
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
	}
	return err
}
