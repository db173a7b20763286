package cluster_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/volume-agent/volume-agent/test/cluster"
)

// fakeGo is a `go` that "builds" by writing a script that prints its
// package to the -o path, and logs each package it built, so that the test
// can see what test/tools/build.sh rebuilds without building anything.
const fakeGo = `#!/bin/sh
out= pkg=
while [ $# -gt 0 ]; do
	case $1 in
	-o) out=$2; shift ;;
	-ldflags) shift ;;
	build|-trimpath) ;;
	*) pkg=$1 ;;
	esac
	shift
done
printf '#!/bin/sh\necho %s\n' "$pkg" >"$out"
chmod +x "$out"
echo "$pkg" >>"$FAKE_GO_LOG"
`

// test/tools/build.sh caches each group of tools under a key of its own:
// the directory it prints holds all seven programs, a second run builds
// nothing, a change to the sidecars' module rebuilds only the sidecars
// (never kube-apiserver, the 15-minute build), a change to the kube
// recipe rebuilds the kube group only, and a change to ownership-peer's
// recipe (make bench's kubelet fsGroup code) only ownership-peer. Run on a copy of the scripts with a
// fake go, so it takes milliseconds.
func TestBuildScriptCachesGroupsApart(t *testing.T) {
	root, err := cluster.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	tools := filepath.Join(t.TempDir(), "tools")
	if out, err := exec.Command("cp", "-r", filepath.Join(root, "test", "tools"), tools).CombinedOutput(); err != nil {
		t.Fatalf("copy test/tools: %v: %s", err, out)
	}
	fakeBin, cache, log := t.TempDir(), t.TempDir(), filepath.Join(t.TempDir(), "built")
	if err := os.WriteFile(filepath.Join(fakeBin, "go"), []byte(fakeGo), 0o755); err != nil {
		t.Fatal(err)
	}

	kube := []string{"k8s.io/kubernetes/cmd/kube-apiserver", "k8s.io/kubernetes/cmd/kube-controller-manager", "."}
	sidecars := []string{
		"github.com/kubernetes-csi/external-provisioner/v6/cmd/csi-provisioner",
		"github.com/kubernetes-csi/external-attacher/v4/cmd/csi-attacher",
		"github.com/kubernetes-csi/external-resizer/v2/cmd/csi-resizer",
	}
	peer := []string{"./ownership-peer"}
	// run runs build.sh and returns the directory it printed and the
	// packages it built.
	run := func() (string, []string) {
		t.Helper()
		os.Remove(log)
		cmd := exec.Command(filepath.Join(tools, "build.sh"))
		cmd.Env = append(os.Environ(), "PATH="+fakeBin+":"+os.Getenv("PATH"), "VOLUME_AGENT_TOOLS_CACHE="+cache, "FAKE_GO_LOG="+log)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("build.sh: %v: %s", err, err.(*exec.ExitError).Stderr)
		}
		data, _ := os.ReadFile(log)
		built := strings.Fields(string(data))
		slices.Sort(built)
		return strings.TrimSpace(string(out)), built
	}
	appendTo := func(path, line string) {
		t.Helper()
		f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.WriteString(line + "\n"); err != nil {
			t.Fatal(err)
		}
	}
	sorted := func(s ...[]string) []string { return slices.Sorted(slices.Values(slices.Concat(s...))) }

	dir, built := run()
	if want := sorted(kube, sidecars, peer); !slices.Equal(built, want) {
		t.Fatalf("first run built %q, want %q", built, want)
	}
	for _, name := range []string{"etcd", "kube-apiserver", "kube-controller-manager", cluster.CSIProvisioner, cluster.CSIAttacher, cluster.CSIResizer, "ownership-peer"} {
		st, err := os.Stat(filepath.Join(dir, name))
		if err != nil || st.Mode()&0o111 == 0 {
			t.Errorf("%s: no executable %s (%v)", dir, name, err)
		}
	}

	if again, built := run(); again != dir || len(built) > 0 {
		t.Errorf("second run: %s, built %q; want %s from the cache", again, built, dir)
	}

	appendTo(filepath.Join(tools, "csi", "go.mod"), "// changed")
	csiDir, built := run()
	if !slices.Equal(built, sorted(sidecars)) || csiDir == dir {
		t.Errorf("after a change of test/tools/csi/go.mod: %s, built %q; want a new directory and the sidecars only", csiDir, built)
	}

	appendTo(filepath.Join(tools, "kube", "build.sh"), "# changed")
	kubeDir, built := run()
	if !slices.Equal(built, sorted(kube)) || kubeDir == csiDir {
		t.Errorf("after a change of the kube recipe: %s, built %q; want a new directory and the kube group only", kubeDir, built)
	}

	appendTo(filepath.Join(tools, "peer", "build.sh"), "# changed")
	if peerDir, built := run(); !slices.Equal(built, sorted(peer)) || peerDir == kubeDir {
		t.Errorf("after a change of ownership-peer's recipe: %s, built %q; want a new directory and ownership-peer only", peerDir, built)
	}
}
