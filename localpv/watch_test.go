package localpv

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	"golang.org/x/sys/unix"
	"k8s.io/client-go/rest"

	"github.com/volume-agent/volume-agent/internal/kubeclient"
)

// configMapDir lays out a directory as a ConfigMap volume does: the file
// is a link through ..data to a timestamped directory, and an update
// writes a new directory and swaps ..data atomically.
type configMapDir struct {
	t   *testing.T
	dir string
	gen int
}

func newConfigMapDir(t *testing.T, content string) *configMapDir {
	c := &configMapDir{t: t, dir: t.TempDir()}
	c.update(content)
	must(t, os.Symlink("..data/config.yaml", filepath.Join(c.dir, "config.yaml")))
	return c
}

func (c *configMapDir) file() string { return filepath.Join(c.dir, "config.yaml") }

func (c *configMapDir) update(content string) {
	c.gen++
	ts := filepath.Join(c.dir, "..2030_01_01_00_00_0"+string(rune('0'+c.gen)))
	must(c.t, os.Mkdir(ts, 0o755))
	must(c.t, os.WriteFile(filepath.Join(ts, "config.yaml"), []byte(content), 0o644))
	tmp := filepath.Join(c.dir, "..data_tmp")
	must(c.t, os.Symlink(filepath.Base(ts), tmp))
	must(c.t, os.Rename(tmp, filepath.Join(c.dir, "..data")))
}

func waitSignal(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("no change event after %s", what)
	}
}

func drain(ch <-chan struct{}) {
	for {
		select {
		case <-ch:
		default:
			return
		}
	}
}

func TestConfigWatcherConfigMapSwap(t *testing.T) {
	cm := newConfigMapDir(t, "storageClasses: {}\n")
	cw, err := newConfigWatcher(cm.file(), zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer cw.close()
	drain(cw.changed())
	cm.update("storageClasses:\n  a: {discoveryDir: /a}\n")
	waitSignal(t, cw.changed(), "the ..data swap")
	if data, _ := os.ReadFile(cm.file()); !strings.Contains(string(data), "/a") {
		t.Fatalf("read %q", data)
	}

	// A plain file replaced by rename, as editors do.
	dir := t.TempDir()
	file := filepath.Join(dir, "lv.yaml")
	must(t, os.WriteFile(file, []byte("a"), 0o644))
	cw2, err := newConfigWatcher(file, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer cw2.close()
	drain(cw2.changed())
	must(t, os.WriteFile(file+".tmp", []byte("b"), 0o644))
	must(t, os.Rename(file+".tmp", file))
	waitSignal(t, cw2.changed(), "a rename")
}

func testProvisioner(t *testing.T, file string) *Provisioner {
	t.Helper()
	client, err := kubeclient.New(&rest.Config{Host: "http://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(Options{Client: client, NodeName: "node-1", ConfigFile: file, Log: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestReloadKeepsLastGood(t *testing.T) {
	cm := newConfigMapDir(t, "storageClasses:\n  a: {discoveryDir: /a}\n  b: {discoveryDir: /b}\n")
	p := testProvisioner(t, cm.file())
	p.reloadConfig(true)
	if got := strings.Join(p.config().classNames(), ","); got != "a,b" {
		t.Fatalf("classes %s", got)
	}
	if errs := p.Status().Config.Errors; len(errs) != 0 {
		t.Fatalf("errors %v", errs)
	}

	// Broken YAML: everything kept, the error reported.
	cm.update("storageClasses: [\n")
	p.reloadConfig(false)
	if got := strings.Join(p.config().classNames(), ","); got != "a,b" {
		t.Fatalf("classes after a bad file: %s", got)
	}
	st := p.Status().Config
	if len(st.Errors) != 1 || !strings.Contains(st.Errors[0], "config.yaml: not valid YAML") {
		t.Fatalf("errors %v", st.Errors)
	}

	// One bad class: its last good definition kept, the others updated.
	cm.update("storageClasses:\n  a: {discoveryDir: /a, volumeMode: Raw}\n  b: {discoveryDir: /b2}\n  c: {discoveryDir: /c}\n")
	p.reloadConfig(false)
	cfg := p.config()
	if got := strings.Join(cfg.classNames(), ","); got != "a,b,c" {
		t.Fatalf("classes %s", got)
	}
	if cfg.Classes["a"].DiscoveryDir != "/a" || cfg.Classes["b"].DiscoveryDir != "/b2" {
		t.Fatalf("a %+v b %+v", cfg.Classes["a"], cfg.Classes["b"])
	}
	st = p.Status().Config
	if len(st.Errors) != 1 || !strings.Contains(st.Errors[0], `storage class "a": volumeMode: "Raw" is neither Filesystem nor Block`) {
		t.Fatalf("errors %v", st.Errors)
	}

	// The file disappears: kept.
	must(t, os.Remove(cm.file()))
	p.reloadConfig(false)
	if got := strings.Join(p.config().classNames(), ","); got != "a,b,c" {
		t.Fatalf("classes after the file went away: %s", got)
	}
	if st := p.Status().Config; len(st.Errors) != 1 || !strings.Contains(st.Errors[0], "cannot read") {
		t.Fatalf("errors %v", st.Errors)
	}

	// The same content back: read again, the read error gone.
	must(t, os.Symlink("..data/config.yaml", cm.file()))
	p.reloadConfig(false)
	if st := p.Status().Config; len(st.Errors) != 1 || !strings.Contains(st.Errors[0], "volumeMode") {
		t.Fatalf("errors after the file came back %v", st.Errors)
	}

	// A missing file at start: no classes, an error, no crash.
	p2 := testProvisioner(t, filepath.Join(t.TempDir(), "absent.yaml"))
	p2.reloadConfig(true)
	if cfg := p2.config(); cfg == nil || len(cfg.Classes) != 0 {
		t.Fatalf("%+v", cfg)
	}
}

func TestWatchMounts(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting needs root")
	}
	ctx, cancel := context.WithCancel(context.Background())
	woke := make(chan struct{}, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		watchMounts(ctx, zaptest.NewLogger(t), func() {
			select {
			case woke <- struct{}{}:
			default:
			}
		})
	}()
	dir := t.TempDir()
	// The watcher may not poll yet: mount until it notices.
	deadline := time.After(10 * time.Second)
	for noticed := false; !noticed; {
		mountAndUnmount(t, dir)
		select {
		case <-woke:
			noticed = true
		case <-time.After(100 * time.Millisecond):
		case <-deadline:
			t.Fatal("a mount was not noticed")
		}
	}
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("watchMounts did not stop")
	}
}

func mountAndUnmount(t *testing.T, dir string) {
	t.Helper()
	must(t, unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"))
	must(t, unix.Unmount(dir, 0))
}
