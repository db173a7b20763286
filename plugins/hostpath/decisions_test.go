package hostpath_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.uber.org/zap"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/volume-agent/volume-agent/plugins"
	"github.com/volume-agent/volume-agent/plugins/hostpath"
	"github.com/volume-agent/volume-agent/plugins/pluginstest"
	"github.com/volume-agent/volume-agent/volume"
)

// The plugin's decisions, with a fake mounter (no root needed). The real
// mounts are tested in hostpath_test.go.

// newFakeFixture returns a fixture with a fake mounter and the host's root
// at a temporary directory holding dir/ and file.
func newFakeFixture(t *testing.T) (*fixture, *pluginstest.Mounter) {
	t.Helper()
	m := pluginstest.NewMounter()
	host := t.TempDir()
	if err := os.Mkdir(filepath.Join(host, "dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(host, "file"), []byte("host data"), 0o644); err != nil {
		t.Fatal(err)
	}
	paths := volume.Paths{Root: t.TempDir()}
	h := plugins.Host{Paths: paths, Mounter: m, NodeName: "node", HostRoot: host, Log: zap.NewNop()}
	return &fixture{
		plugin: hostpath.New(h), paths: paths, host: host,
		pod: volume.PodInfo{PodRef: volume.PodRef{UID: types.UID("pod-1"), Namespace: "ns", Name: "pod"}},
	}, m
}

func TestSetUpDecisions(t *testing.T) {
	cases := []struct {
		name     string
		spec     *volume.Spec
		mounted  bool
		fault    *pluginstest.Fault
		wantBind string // after "BindMount <host>/<path> <dir>"; "-" for none
		wantFile bool   // the mount point is a file
		wantErr  bool
	}{
		// Recursive, as container runtimes bind host paths.
		{name: "directory", spec: inline("v", "/dir", nil), wantBind: "/dir rec"},
		{name: "read-only PV", spec: pvSpec("v", "/dir", nil, true), wantBind: "/dir ro rec"},
		{name: "file", spec: inline("v", "/file", typ(v1.HostPathFile)), wantBind: "/file rec", wantFile: true},
		{name: "set up before", spec: inline("v", "/dir", nil), mounted: true, wantBind: "-"},
		{name: "wrong type", spec: inline("v", "/file", typ(v1.HostPathDirectory)), wantBind: "-", wantErr: true},
		{name: "bind fails", spec: inline("v", "/dir", nil), fault: &pluginstest.Fault{Op: "BindMount", Err: errors.New("boom")}, wantBind: "/dir rec", wantErr: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f, m := newFakeFixture(t)
			dir := f.dir(c.spec)
			if c.mounted {
				if err := os.MkdirAll(dir, 0o750); err != nil {
					t.Fatal(err)
				}
				m.SetMounted(f.host+"/dir", dir)
			}
			if c.fault != nil {
				m.Fail(*c.fault)
			}
			err := f.setUp(c.spec)
			if (err != nil) != c.wantErr || volume.IsUncertain(err) {
				t.Fatalf("SetUp: %v, want an error %v (and never uncertain)", err, c.wantErr)
			}
			var want []string
			if c.wantBind != "-" {
				source, opts, _ := strings.Cut(c.wantBind, " ")
				want = []string{"BindMount " + f.host + source + " " + dir + " " + opts}
			}
			if got := m.CallStrings(); !slices.Equal(got, want) {
				t.Errorf("mounter calls %q, want %q", got, want)
			}
			if info, serr := os.Stat(dir); c.wantBind != "-" && (serr != nil || info.IsDir() == c.wantFile) {
				t.Errorf("mount point %s: %v, want a file %v", dir, serr, c.wantFile)
			}
		})
	}
}

// The bind mount and every mount below it go before the mount point, and
// the mount point only once they are gone.
func TestTearDownDecisions(t *testing.T) {
	for _, fail := range []bool{false, true} {
		f, m := newFakeFixture(t)
		s := inline("v", "/dir", nil)
		dir := f.dir(s)
		if err := os.MkdirAll(dir, 0o750); err != nil {
			t.Fatal(err)
		}
		m.SetMounted(f.host+"/dir", dir)
		m.SetMounted("tmpfs", filepath.Join(dir, "sub")) // a submount of the host's
		if fail {
			m.Fail(pluginstest.Fault{Op: "UnmountTree", Err: errors.New("busy")})
		}
		err := f.tearDown(s)
		if (err != nil) != fail {
			t.Errorf("TearDown with a failing unmount %v: %v", fail, err)
		}
		want := []string{"UnmountTree " + dir}
		if !fail {
			want = append(want, "UnmountAll "+dir)
		}
		if got := m.CallStrings(); !slices.Equal(got, want) {
			t.Errorf("failing unmount %v: mounter calls %q, want %q", fail, got, want)
		}
		if left := m.Mounted(); (len(left) > 0) != fail {
			t.Errorf("failing unmount %v: mounts left %v", fail, left)
		}
		if _, serr := os.Stat(dir); (serr == nil) != fail {
			t.Errorf("failing unmount %v: mount point kept %v", fail, serr == nil)
		}
	}
}
