package cluster

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
)

const modulePath = "github.com/volume-agent/volume-agent"

var toolBinaries = []string{"etcd", "kube-apiserver", "kube-controller-manager"}

// The CSI sidecars test/tools/build.sh builds beside the control plane
// (module test/tools/csi), for the suites that run a driver's controller
// side as a cluster does. See SidecarBin.
const (
	CSIProvisioner = "csi-provisioner" // external-provisioner v6
	CSIAttacher    = "csi-attacher"    // external-attacher v4
	CSIResizer     = "csi-resizer"     // external-resizer v2
)

// Sidecars are the CSI sidecars, by program name.
var Sidecars = []string{CSIProvisioner, CSIAttacher, CSIResizer}

var (
	toolsOnce sync.Once
	toolsDir  string
	toolsErr  error
)

// ToolsBin returns the directory holding etcd, kube-apiserver and
// kube-controller-manager (and the CSI sidecars, see SidecarBin):
// $VOLUME_AGENT_TOOLS_BIN if set, otherwise what test/tools/build.sh prints.
// That script builds them once into caches outside the repo (10-20 minutes
// cold) and returns at once afterwards.
func ToolsBin() (string, error) {
	toolsOnce.Do(func() { toolsDir, toolsErr = findTools() })
	return toolsDir, toolsErr
}

// SidecarBin returns the path of a CSI sidecar (CSIProvisioner...) in
// ToolsBin's directory, or an error saying why there is none, e.g. when
// VOLUME_AGENT_TOOLS_BIN names a directory built before the sidecars were.
// The control-plane binaries alone do not need them, so ToolsBin does not
// require them.
func SidecarBin(name string) (string, error) {
	dir, err := ToolsBin()
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, name)
	if st, err := os.Stat(path); err != nil || st.Mode()&0o111 == 0 {
		return "", fmt.Errorf("%s: no executable %s (test/tools/build.sh builds the CSI sidecars from test/tools/csi into the directory it prints)", dir, name)
	}
	return path, nil
}

func findTools() (string, error) {
	dir := os.Getenv("VOLUME_AGENT_TOOLS_BIN")
	if dir == "" {
		var err error
		if dir, err = buildTools(); err != nil {
			return "", err
		}
	}
	for _, name := range toolBinaries {
		if st, err := os.Stat(filepath.Join(dir, name)); err != nil || st.Mode()&0o111 == 0 {
			return "", fmt.Errorf("%s: no executable %s", dir, name)
		}
	}
	return dir, nil
}

func buildTools() (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	// go test runs packages in parallel; without this lock several of them
	// would run the same cold build into the same output files.
	lock, err := os.OpenFile(filepath.Join(os.TempDir(), "volume-agent-tools-build.lock"), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return "", err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", err
	}

	var stdout, stderr bytes.Buffer
	cmd := exec.Command(filepath.Join(root, "test", "tools", "build.sh"))
	cmd.Stdout = &stdout
	// Show progress: a cold build is slow enough that silence looks like a hang.
	cmd.Stderr = io.MultiWriter(os.Stderr, &stderr)
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("test/tools/build.sh: %v\n%s", err, lastLines(stderr.String(), 20))
	}
	out := strings.Fields(stdout.String())
	if len(out) == 0 {
		return "", errors.New("test/tools/build.sh printed no directory")
	}
	return out[len(out)-1], nil
}

// RepoRoot returns the root of the volume-agent checkout: found from this
// source file's location, or else by walking up from the working directory to
// the go.mod of the module.
func RepoRoot() (string, error) {
	if _, file, _, ok := runtime.Caller(0); ok {
		root := filepath.Join(filepath.Dir(file), "..", "..")
		if isRepoRoot(root) {
			return filepath.Clean(root), nil
		}
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if isRepoRoot(dir) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("cannot find the volume-agent repository root (no go.mod of " + modulePath + " above the working directory)")
		}
		dir = parent
	}
}

func isRepoRoot(dir string) bool {
	data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		return false
	}
	for line := range strings.Lines(string(data)) {
		if strings.TrimSpace(line) == "module "+modulePath {
			return true
		}
	}
	return false
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
