// Package page_test drives the operator page in a real browser: the
// volume-agent binary runs in standalone mode on a copy of
// examples/manifests (which include a pod whose claim does not exist), and
// headless Chromium (Debian's package, installed by .ci/run) loads the page,
// through chromedp. It checks every pod and the failing volume's reason are
// shown, a pod added after the page loaded appears without a reload, the
// filters and a pod's detail view (mount tree, timeline) work, the page
// works without JavaScript, and nothing is logged to the console. The
// screenshots are saved in $VOLUME_AGENT_ARTIFACTS/page, or
// test/artifacts/page.
//
// The tests need root (the agent mounts) and Chromium: without them they
// skip with the reason, unless CI or VOLUME_AGENT_REQUIRE_BROWSER and
// VOLUME_AGENT_REQUIRE_ROOT are set (as `make test` does), where a missing
// browser or root fails them.
package page_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"

	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/test/cluster"
	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
	"github.com/volume-agent/volume-agent/ui/client"
	"github.com/volume-agent/volume-agent/ui/model"
)

var suite struct {
	skip     string
	bin      string
	chromium string
	// artifacts is where screenshots go.
	artifacts string
}

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	if suite.skip = e2eutil.SkipReason(); suite.skip != "" {
		return m.Run()
	}
	if suite.chromium = findChromium(); suite.chromium == "" {
		suite.skip = "Chromium is not installed (apt-get install chromium; .ci/run installs it)"
		if os.Getenv("CI") != "" || os.Getenv("VOLUME_AGENT_REQUIRE_BROWSER") != "" {
			fmt.Fprintln(os.Stderr, "the browser tests must run here:", suite.skip)
			return 1
		}
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "volume-agent-page-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	bins, err := e2eutil.Build(context.Background(), dir, e2eutil.BuildOptions{Race: e2eutil.RaceEnabled})
	if err != nil {
		fmt.Fprintln(os.Stderr, "building volume-agent:", err)
		return 1
	}
	suite.bin = bins.AgentBin
	if suite.artifacts, err = artifactsDir(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("screenshots go to", suite.artifacts)
	return m.Run()
}

// findChromium returns $VOLUME_AGENT_CHROMIUM or Debian's chromium.
func findChromium() string {
	if p := os.Getenv("VOLUME_AGENT_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

func artifactsDir() (string, error) {
	base := os.Getenv("VOLUME_AGENT_ARTIFACTS")
	if base == "" {
		root, err := cluster.RepoRoot()
		if err != nil {
			return "", err
		}
		base = filepath.Join(root, "test", "artifacts")
	}
	dir := filepath.Join(base, "page")
	return dir, os.MkdirAll(dir, 0o755)
}

func require(t *testing.T) {
	t.Helper()
	e2eutil.Skip(t, suite.skip)
}

// examples starts an agent on a copy of examples/manifests whose host paths
// point into a directory of the test.
func examples(t *testing.T) (*e2eutil.Agent, *e2eutil.Manifests) {
	t.Helper()
	root, err := cluster.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	base := t.TempDir()
	for _, d := range []string{"local/content", "host"} {
		if err := os.MkdirAll(filepath.Join(base, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	agentRoot := mounttest.TempDir(t)
	m := e2eutil.NewManifests(t)
	files, err := filepath.Glob(filepath.Join(root, "examples", "manifests", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no example manifests: %v", err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		m.WriteRaw(filepath.Base(f), strings.ReplaceAll(string(b), "/tmp/volume-agent-example", base))
	}
	a := e2eutil.StartAgent(t, e2eutil.AgentOptions{
		Binary: suite.bin, Node: "example-node", Root: agentRoot,
		Args: []string{"--pod-manifest-path", m.Dir, "--shutdown-grace-period", "10s"}, ReadyTimeout: 30 * time.Second,
	})
	// The example's pods are set up (or failing) before the browser
	// looks.
	c := client.New(a.DebugURL())
	e2eutil.PollErr(t, 30*time.Second, "the example pods are set up", func() error {
		p, err := c.Page(t.Context(), model.Filter{})
		if err != nil {
			return err
		}
		states := map[string]model.PodState{}
		for _, pod := range p.Pods {
			states[pod.Name] = pod.State
		}
		if states["web"] != model.PodReady || states["worker"] != model.PodReady || states["waiting-for-claim"] != model.PodError {
			return fmt.Errorf("pods %v", states)
		}
		return nil
	})
	return a, m
}

// browser is one headless Chromium, with what its pages logged as errors.
type browser struct {
	t   *testing.T
	ctx context.Context

	mu       sync.Mutex
	problems []string
}

func newBrowser(t *testing.T) *browser {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(suite.chromium),
		chromedp.NoSandbox, // root, in a container
		chromedp.DisableGPU,
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 900),
		// Nothing but the agent is reachable: keep Chromium from trying.
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("hide-scrollbars", true),
	)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(allocCtx)
	t.Cleanup(func() {
		cancel()
		cancelAlloc() // stops Chromium and waits for it
	})
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("starting %s: %v", suite.chromium, err)
	}
	return &browser{t: t, ctx: ctx}
}

// tab opens a new tab whose console errors and warnings, uncaught
// exceptions and failed loads are recorded.
func (b *browser) tab() context.Context {
	ctx, cancel := chromedp.NewContext(b.ctx)
	done := make(chan struct{})
	b.t.Cleanup(func() { cancel(); <-done })
	messages := chromedp.Console(ctx)
	go func() {
		defer close(done)
		for m, err := range messages {
			if err != nil {
				return
			}
			switch m.Type {
			case chromedp.ConsoleError, chromedp.ConsoleWarning, chromedp.ConsoleException:
				b.mu.Lock()
				b.problems = append(b.problems, fmt.Sprintf("%s (%s %s)", m, m.Source, m.URL))
				b.mu.Unlock()
			}
		}
	}()
	return ctx
}

// do runs actions, failing the test on an error.
func (b *browser) do(ctx context.Context, actions ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		b.t.Fatal(err)
	}
}

func get[T any](b *browser, ctx context.Context, a chromedp.Action[T]) T {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		b.t.Fatal(err)
	}
	return v
}

// text is the visible text of the element matching the CSS selector.
func (b *browser) text(ctx context.Context, sel string) string {
	b.t.Helper()
	return get(b, ctx, chromedp.Text(chromedp.CSS(sel)))
}

// eval evaluates a JavaScript expression.
func eval[T any](b *browser, ctx context.Context, expr string) T {
	b.t.Helper()
	return get(b, ctx, chromedp.Evaluate[T](expr))
}

// screenshot saves the whole page as <name>.png.
func (b *browser) screenshot(ctx context.Context, name string) {
	b.t.Helper()
	png := get(b, ctx, chromedp.FullScreenshot(100))
	path := filepath.Join(suite.artifacts, name+".png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		b.t.Fatal(err)
	}
	b.t.Logf("screenshot: %s", path)
}

// noProblems fails the test if a page logged an error or a warning.
func (b *browser) noProblems() {
	b.t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, p := range b.problems {
		b.t.Errorf("the page logged %s", p)
	}
}

// live waits until the page's stream is connected.
var live = chromedp.WaitVisible(chromedp.CSS("#live-status.on"))

const lateManifest = `apiVersion: v1
kind: Pod
metadata:
  name: added-later
  namespace: team-b
spec:
  containers:
  - name: app
    image: busybox
    volumeMounts: [{name: cache, mountPath: /cache}]
  volumes:
  - name: cache
    emptyDir: {medium: Memory}
`

func TestPage(t *testing.T) {
	require(t)
	agent, manifests := examples(t)
	b := newBrowser(t)
	url := agent.DebugURL()

	// The page, live.
	page := b.tab()
	b.do(page, chromedp.Navigate(url+"/"), live)
	// Every pod the agent has is on the page.
	known, err := client.New(url).Page(t.Context(), model.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range known.Pods {
		if row := b.text(page, fmt.Sprintf(`tbody[data-pod="%s/%s"] td.podcell`, p.Namespace, p.Name)); !strings.Contains(row, p.Name) {
			t.Errorf("pod %s/%s: its row says %q", p.Namespace, p.Name, row)
		}
	}
	pods := b.text(page, "#live table.pods")
	for _, want := range []string{"waiting-for-claim", "web", "worker", "PVCNotFound: PVC default/does-not-exist not found"} {
		if !strings.Contains(pods, want) {
			t.Errorf("the pods table lacks %q:\n%s", want, pods)
		}
	}
	failing := b.text(page, `tbody[data-pod="default/waiting-for-claim"] tr.vol-error`)
	if !strings.Contains(failing, "data") || !strings.Contains(failing, "does-not-exist not found") {
		t.Errorf("the failing volume's row: %q", failing)
	}
	b.screenshot(page, "1-node")

	// A pod added after the page loaded appears without a reload.
	eval[bool](b, page, `window.loadedOnce = true`)
	manifests.WriteRaw("late.yaml", lateManifest)
	e2eutil.PollErr(t, 30*time.Second, "the new pod shows up on the page", func() error {
		s, err := chromedp.Run(page, chromedp.Evaluate[string](`document.getElementById("live").innerText`))
		if err != nil {
			return err
		}
		if !strings.Contains(s, "team-b/added-later") {
			return fmt.Errorf("not yet: the page shows %.300q", s)
		}
		return nil
	})
	if !eval[bool](b, page, `window.loadedOnce === true`) {
		t.Error("the page was reloaded to show the new pod")
	}
	e2eutil.PollErr(t, 30*time.Second, "the new pod's volume is mounted on the page", func() error {
		s, err := chromedp.Run(page, chromedp.Text(chromedp.CSS(`tbody[data-pod="team-b/added-later"]`)))
		if err != nil {
			return err
		}
		if !strings.Contains(s, "mounted") {
			return fmt.Errorf("the new pod's row: %q", s)
		}
		return nil
	})
	b.screenshot(page, "2-node-after-a-pod-was-added")

	// Filters: choosing a state submits the form.
	eval[bool](b, page, `(() => { const s = document.querySelector('select[name=state]'); s.value = 'error'; s.dispatchEvent(new Event('change')); return true; })()`)
	e2eutil.PollErr(t, 20*time.Second, "the filter is applied", func() error {
		search, err := chromedp.Run(page, chromedp.Evaluate[string](`location.search`))
		if err != nil {
			return err
		}
		if search != "?namespace=&pod=&state=error" {
			return fmt.Errorf("location.search %q", search)
		}
		return nil
	})
	b.do(page, live)
	filtered := b.text(page, "#live table.pods")
	if !strings.Contains(filtered, "waiting-for-claim") || strings.Contains(filtered, "worker") {
		t.Errorf("state=error shows:\n%s", filtered)
	}
	b.screenshot(page, "3-filtered-by-state")

	// A pod's detail view: its volumes, mount tree and timeline.
	b.do(page, chromedp.Navigate(url+"/pods/default/web"), live)
	// SVG has no innerText.
	tree := get(b, page, chromedp.TextContent(chromedp.CSS("svg.tree")))
	for _, want := range []string{"content · mounted", "default/worker · mounted", "this pod · mounted", "tmpfs"} {
		if !strings.Contains(tree, want) {
			t.Errorf("the mount tree lacks %q: %s", want, tree)
		}
	}
	timeline := b.text(page, "table.timeline-table")
	if strings.Count(timeline, "mount_volume") < 4 || !strings.Contains(timeline, "succeeded") {
		t.Errorf("the timeline lacks web's four mounts: %s", timeline)
	}
	b.screenshot(page, "4-pod-web")

	b.do(page, chromedp.Navigate(url+"/pods/default/waiting-for-claim"), live)
	if head := b.text(page, "section.podhead"); !strings.Contains(head, "data: PVCNotFound: PVC default/does-not-exist not found") {
		t.Errorf("the failing pod's header: %s", head)
	}
	b.screenshot(page, "5-pod-waiting-for-claim")

	// Without JavaScript the page shows the same, filters work, nothing
	// is live.
	static := b.tab()
	if _, err := chromedp.Call(static, emulation.SetScriptExecutionDisabled, emulation.SetScriptExecutionDisabledParams{Value: true}); err != nil {
		t.Fatal(err)
	}
	b.do(static, chromedp.Navigate(url+"/?namespace=default&state=not-ready"))
	if s := b.text(static, "#live-status"); s != "static view" {
		t.Errorf("without JavaScript the status says %q", s)
	}
	noJS := b.text(static, "#live")
	if !strings.Contains(noJS, "waiting-for-claim") || !strings.Contains(noJS, "does-not-exist not found") || strings.Contains(noJS, "worker") {
		t.Errorf("without JavaScript, namespace=default&state=not-ready shows:\n%s", noJS)
	}
	b.screenshot(static, "6-without-javascript")

	b.noProblems()
}
