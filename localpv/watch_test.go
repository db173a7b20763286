package localpv

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/volume-agent/volume-agent/internal/kubeclient"
	"github.com/volume-agent/volume-agent/internal/mounttest"
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

// wakeRecorder is a wake function for watcher tests.
func wakeRecorder() (func(), <-chan struct{}) {
	ch := make(chan struct{}, 1)
	return func() {
		select {
		case ch <- struct{}{}:
		default:
		}
	}, ch
}

func startDirWatcher(t *testing.T, dirs ...string) (*dirWatcher, <-chan struct{}) {
	t.Helper()
	dw, err := newDirWatcher(zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	wake, woke := wakeRecorder()
	done := make(chan struct{})
	go func() { defer close(done); dw.run(ctx, wake) }()
	t.Cleanup(func() { cancel(); dw.close(); <-done })
	dw.set(dirs)
	return dw, woke
}

// TestDirWatcherFollowsTheDirectory: each change below is made after the
// pass that would follow the previous one (set), and must wake the
// provisioner by an event, not wait for the rescan.
func TestDirWatcherFollowsTheDirectory(t *testing.T) {
	root := mounttest.TempDir(t)
	disks := filepath.Join(root, "a", "b", "disks")
	dw, woke := startDirWatcher(t, disks)

	for i, step := range []struct {
		what   string
		change func()
		root   bool
	}{
		// A discovery directory that does not exist yet: making it (even
		// with a missing parent) is seen, and so are entries made in it.
		{what: "making the missing parent", change: func() { must(t, os.Mkdir(filepath.Dir(filepath.Dir(disks)), 0o755)) }},
		{what: "making the directory's parent", change: func() { must(t, os.Mkdir(filepath.Dir(disks), 0o755)) }},
		{what: "making the directory", change: func() { must(t, os.Mkdir(disks, 0o755)) }},
		{what: "an entry in the new directory", change: func() { must(t, os.Symlink("/dev/null", filepath.Join(disks, "dev1"))) }},
		// The directory removed and made again: the watch follows.
		{what: "removing the directory", change: func() { must(t, os.RemoveAll(disks)) }},
		{what: "making it again", change: func() { must(t, os.Mkdir(disks, 0o755)) }},
		{what: "an entry in the remade directory", change: func() { must(t, os.Symlink("/dev/null", filepath.Join(disks, "dev2"))) }},
		// A filesystem mounted on the directory: inotify watched the
		// directory underneath; entries are made in the mounted one.
		{what: "an entry in a filesystem mounted on the directory", root: true, change: func() {
			must(t, unix.Mount("tmpfs", disks, "tmpfs", 0, "size=1m"))
			dw.set([]string{disks}) // the pass the mount watcher starts
			drain(woke)
			must(t, os.Symlink("/dev/null", filepath.Join(disks, "dev3")))
		}},
	} {
		if step.root && os.Geteuid() != 0 {
			// A subtest that skips (or fails, where root is required):
			// the other steps still count.
			t.Run(step.what, func(t *testing.T) { mounttest.RequireRoot(t) })
			continue
		}
		drain(woke)
		step.change()
		select {
		case <-woke:
		case <-time.After(5 * time.Second):
			t.Fatalf("step %d: %s woke nobody", i+1, step.what)
		}
		dw.set([]string{disks})
	}
	// Only the directory itself is watched now, not the stand-ins.
	dw.mu.Lock()
	defer dw.mu.Unlock()
	if len(dw.watched) != 1 {
		t.Errorf("watching %v, want only %s", dw.watched, disks)
	}
}

// blockingProber holds the first pass in its first probe until released.
type blockingProber struct {
	entered, release chan struct{}
	once             sync.Once
}

func (b *blockingProber) probe(string) probe {
	b.once.Do(func() {
		close(b.entered)
		<-b.release
	})
	return probe{Kind: KindDirectory}
}

// staticInformer is an informer of an API server that holds list and
// never changes.
func staticInformer(list runtime.Object, obj runtime.Object) cache.SharedIndexInformer {
	return cache.NewSharedIndexInformer(listThenWait{&cache.ListWatch{
		ListWithContextFunc: func(context.Context, metav1.ListOptions) (runtime.Object, error) { return list.DeepCopyObject(), nil },
		WatchFuncWithContext: func(context.Context, metav1.ListOptions) (watch.Interface, error) {
			return watch.NewFake(), nil
		},
	}}, obj, 0, cache.Indexers{})
}

// listThenWait makes the reflector list, not stream the initial state
// (which needs bookmarks the fake watch does not send).
type listThenWait struct{ *cache.ListWatch }

func (listThenWait) IsWatchListSemanticsUnSupported() bool { return true }

// TestMountDuringPassStartsAnotherPass: a mount while a pass is running
// (here: held in its first probe, after the entry was listed) starts
// another pass as soon as that one ends, with the rescan an hour away.
// It runs in its own mount namespace, where no other test's mount can
// start that pass instead.
func TestMountDuringPassStartsAnotherPass(t *testing.T) {
	if !mounttest.OwnMountNamespace(t) {
		return
	}
	disks := mounttest.TempDir(t)
	entry := filepath.Join(disks, "disk1")
	must(t, os.Mkdir(entry, 0o755))
	file := filepath.Join(t.TempDir(), "config.yaml")
	must(t, os.WriteFile(file, []byte("storageClasses:\n  fast: {discoveryDir: "+disks+"}\n"), 0o644))
	client, err := kubeclient.New(&rest.Config{Host: "http://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	infs := []cache.SharedIndexInformer{
		staticInformer(&v1.PersistentVolumeList{}, &v1.PersistentVolume{}),
		staticInformer(&storagev1.StorageClassList{}, &storagev1.StorageClass{}),
		staticInformer(&v1.NodeList{}, &v1.Node{}),
	}
	for _, inf := range infs {
		go inf.Run(ctx.Done())
	}
	p, err := New(Options{
		Client: client, NodeName: "node-1", ConfigFile: file, Log: zaptest.NewLogger(t),
		ResyncPeriod: time.Hour, ConfigSyncPeriod: time.Hour,
		PVInformer: infs[0], ClassInformer: infs[1], NodeInformer: infs[2],
	})
	if err != nil {
		t.Fatal(err)
	}
	bp := &blockingProber{entered: make(chan struct{}), release: make(chan struct{})}
	p.prober = bp
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})

	select {
	case <-bp.entered:
	case <-time.After(30 * time.Second):
		t.Fatalf("no pass probed the entry: %+v", p.Status())
	}
	must(t, unix.Mount("tmpfs", entry, "tmpfs", 0, "size=1m"))
	// The mount watcher's wake-up is pending while the pass runs.
	deadline := time.Now().Add(10 * time.Second)
	for len(p.wake.C()) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the mount did not wake the provisioner")
		}
		time.Sleep(time.Millisecond) // polling a condition, with a deadline
	}
	close(bp.release)
	deadline = time.Now().Add(10 * time.Second)
	for p.Status().Passes < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("%d passes: the wake-up during the first pass was lost (the rescan is an hour away)", p.Status().Passes)
		}
		time.Sleep(time.Millisecond)
	}
}
