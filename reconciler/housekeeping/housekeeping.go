package housekeeping

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/types"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/internal/atomicfile"
	"github.com/volume-agent/volume-agent/internal/subpath"
	"github.com/volume-agent/volume-agent/volume"
)

// CleanPodDirs removes what is left of pods that are gone once nothing of
// theirs is mounted or known any more: sub-path bind mounts (the agent's
// own, which a crash between preparing them and tearing the volume down can
// leave), empty volume directories, empty state directories, the pod
// directory. Apart from sub-path targets it never deletes a file or a
// non-empty directory and never touches a mount point; whatever it cannot
// remove is returned as a problem to report.
func CleanPodDirs(paths volume.Paths, dsw *cache.DesiredSnapshot, asw *cache.ActualSnapshot, isMountPoint func(string) (bool, error)) []Problem {
	busy := map[types.UID]bool{}
	for uid := range dsw.Pods() {
		busy[uid] = true
	}
	for _, v := range asw.Volumes() {
		for uid := range v.Pods.All() {
			busy[uid] = true
		}
	}
	entries, err := os.ReadDir(paths.PodsDir())
	if err != nil {
		return nil
	}
	var problems []Problem
	for _, e := range entries {
		uid := types.UID(e.Name())
		if !e.IsDir() || busy[uid] {
			continue
		}
		podDir := paths.PodDir(uid)
		left := cleanSubPaths(paths.PodSubPathsDir(uid))
		for _, sub := range []string{"volume-subpaths", "volumes", "volumeDevices", "volume-state"} {
			left = append(left, removeEmptyTree(filepath.Join(podDir, sub), layoutDepth[sub], isMountPoint)...)
		}
		if err := unix.Rmdir(podDir); err == nil || errors.Is(err, unix.ENOENT) {
			continue
		}
		rest, _ := os.ReadDir(podDir)
		for _, r := range rest {
			if r.Name() != "volumes" && r.Name() != "volumeDevices" && r.Name() != "volume-state" && r.Name() != "volume-subpaths" {
				left = append(left, filepath.Join(podDir, r.Name()))
			}
		}
		sort.Strings(left)
		if len(left) > 5 {
			left = append(left[:5], fmt.Sprintf("and %d more", len(left)-5))
		}
		problems = append(problems, Problem{Path: podDir, PodUID: uid,
			Reason: "pod is gone but its directory still holds what the agent does not own or cannot reconstruct: " + strings.Join(left, ", ")})
	}
	return problems
}

// layoutDepth is how deep the agent's own directories go below each of a
// pod's directories: <plugin>/<volume> (<plugin>/<volume>/<container>/<index>
// for sub-paths). Below that is a volume's content, the pod's, which
// housekeeping never walks.
var layoutDepth = map[string]int{"volumes": 2, "volumeDevices": 2, "volume-state": 2, "volume-subpaths": 4}

// cleanSubPaths removes the sub-path targets of every volume of a gone pod
// (<dir>/<plugin>/<specName>/<container>/<index>) and returns what it had
// to leave.
func cleanSubPaths(dir string) []string {
	plugins, _ := os.ReadDir(dir)
	var left []string
	for _, pl := range plugins {
		vols, _ := os.ReadDir(filepath.Join(dir, pl.Name()))
		for _, v := range vols {
			if err := subpath.Clean(filepath.Join(dir, pl.Name(), v.Name())); err != nil {
				left = append(left, err.Error())
			}
		}
	}
	return left
}

// removeEmptyTree removes empty directories bottom-up below and including
// dir, at most depth levels down, and returns the paths it had to leave
// (files, mount points, non-empty directories).
func removeEmptyTree(dir string, depth int, isMountPoint func(string) (bool, error)) []string {
	info, err := os.Lstat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil || !info.IsDir() {
		return []string{dir}
	}
	if mounted, err := isMountPoint(dir); err != nil || mounted {
		return []string{dir}
	}
	if depth == 0 {
		if err := unix.Rmdir(dir); err != nil && !errors.Is(err, unix.ENOENT) {
			return []string{dir}
		}
		return nil
	}
	atomicfile.RemoveTemps(dir)
	children, err := os.ReadDir(dir)
	if err != nil {
		return []string{dir}
	}
	var left []string
	for _, c := range children {
		left = append(left, removeEmptyTree(filepath.Join(dir, c.Name()), depth-1, isMountPoint)...)
	}
	if len(left) == 0 {
		if err := unix.Rmdir(dir); err != nil && !errors.Is(err, unix.ENOENT) {
			return []string{dir}
		}
	}
	return left
}

// Orphans keeps what the agent found and cannot clean, reporting each
// problem once (a log line when it appears, not one every pass).
type Orphans struct {
	log *zap.Logger

	mu       sync.Mutex
	problems map[string]OrphanStatus
}

// OrphanStatus is a reported problem.
type OrphanStatus struct {
	Problem
	Since time.Time `json:"since"`
}

// NewOrphans returns an empty report.
func NewOrphans(log *zap.Logger) *Orphans {
	return &Orphans{log: log, problems: map[string]OrphanStatus{}}
}

// Set replaces the problems of one kind (reconstruction or housekeeping).
func (o *Orphans) Set(kind string, problems []Problem) {
	o.mu.Lock()
	defer o.mu.Unlock()
	now := time.Now()
	keep := map[string]bool{}
	for _, p := range problems {
		key := kind + "|" + p.Path
		keep[key] = true
		if old, ok := o.problems[key]; ok && old.Reason == p.Reason {
			continue
		}
		o.problems[key] = OrphanStatus{Problem: p, Since: now}
		o.log.Warn("left on disk: cannot clean up", zap.String("path", p.Path), zap.String("podUID", string(p.PodUID)), zap.String("reason", p.Reason))
	}
	for key := range o.problems {
		if strings.HasPrefix(key, kind+"|") && !keep[key] {
			delete(o.problems, key)
		}
	}
}

// List returns the current problems sorted by path.
func (o *Orphans) List() []OrphanStatus {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := make([]OrphanStatus, 0, len(o.problems))
	for _, p := range o.problems {
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}
