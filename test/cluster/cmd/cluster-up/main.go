// Command cluster-up runs the test control plane (etcd, kube-apiserver and
// kube-controller-manager on 127.0.0.1) in the background for manual work,
// behind `make cluster-up` and `make cluster-down`.
//
//	cluster-up [--dir DIR] [--nodes a,b]   start it and return once it is ready
//	cluster-up --down [--dir DIR]          stop it and remove DIR
//
// DIR defaults to .cluster in the repository root. It holds admin.kubeconfig,
// a node-<name>.kubeconfig per node, the components' logs and a pids file.
// The command detaches by starting itself again with --serve in a new session;
// that supervisor owns the components and stops them in order on SIGTERM.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/volume-agent/volume-agent/test/cluster"
)

const (
	pidsFile      = "pids"
	supervisorLog = "cluster-up.log"
	supervisor    = "cluster-up" // name of the supervisor's line in the pids file
)

func main() {
	dir := flag.String("dir", "", "directory for the cluster's state (default .cluster in the repository root)")
	down := flag.Bool("down", false, "stop the cluster and remove its directory")
	nodes := flag.String("nodes", "node-1", "comma-separated names of Nodes to create, each with its own node kubeconfig")
	serve := flag.Bool("serve", false, "internal: run the control plane in the foreground")
	flag.Parse()

	if *dir == "" {
		root, err := cluster.RepoRoot()
		if err != nil {
			fail(err)
		}
		*dir = filepath.Join(root, ".cluster")
	}
	abs, err := filepath.Abs(*dir)
	if err != nil {
		fail(err)
	}
	var nodeNames []string
	for n := range strings.SplitSeq(*nodes, ",") {
		if n = strings.TrimSpace(n); n != "" {
			nodeNames = append(nodeNames, n)
		}
	}

	switch {
	case *serve:
		err = serveCluster(abs, nodeNames)
	case *down:
		err = stopCluster(abs)
	default:
		err = startCluster(abs, nodeNames)
	}
	if err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "cluster-up:", err)
	os.Exit(1)
}

// startCluster starts the supervisor in a new session and waits until it
// reports, over a pipe, that the control plane is ready or that it failed.
func startCluster(dir string, nodes []string) error {
	if pids, err := readPids(dir); err == nil && alive(pids[supervisor]) {
		fmt.Printf("already running (pid %d)\n", pids[supervisor].pid)
		printUsage(dir, "")
		return nil
	}
	if err := stopCluster(dir); err != nil { // leftovers of a crashed run
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	logFile, err := os.Create(filepath.Join(dir, supervisorLog))
	if err != nil {
		return err
	}
	defer logFile.Close()
	readyR, readyW, err := os.Pipe()
	if err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.Command(self, "--serve", "--dir", dir, "--nodes", strings.Join(nodes, ","))
	cmd.Args[0] = supervisor // what --down checks before signalling the PID
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.ExtraFiles = []*os.File{readyW} // fd 3 in the supervisor
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	readyW.Close()
	// EOF comes when the supervisor closes the pipe after writing, or exits.
	msg, _ := io.ReadAll(readyR)
	url, ok := strings.CutPrefix(string(msg), "ready ")
	if !ok {
		_ = cmd.Wait()
		log, _ := os.ReadFile(logFile.Name())
		return fmt.Errorf("control plane did not start; %s says:\n%s", logFile.Name(), log)
	}
	_ = cmd.Process.Release()
	printUsage(dir, url)
	return nil
}

func printUsage(dir, url string) {
	if url != "" {
		fmt.Printf("control plane is up at %s\n", url)
	}
	fmt.Printf("  export KUBECONFIG=%s\n", filepath.Join(dir, "admin.kubeconfig"))
	if nodes, _ := filepath.Glob(filepath.Join(dir, "node-*.kubeconfig")); len(nodes) > 0 {
		fmt.Printf("  node identities: %s\n", strings.Join(nodes, " "))
	}
	fmt.Printf("  logs: %s/*.log\n", dir)
	fmt.Printf("stop it with hack/cluster-down.sh (or cluster-up --down --dir %s)\n", dir)
}

// serveCluster is the detached supervisor: it runs the control plane until
// SIGTERM or SIGINT.
func serveCluster(dir string, nodes []string) error {
	// fd 3 is the parent's ready pipe. It is inherited without close-on-exec,
	// so the components would otherwise keep it open and the parent would
	// never see EOF if this process dies.
	syscall.CloseOnExec(3)
	ready := os.NewFile(3, "ready")

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	c, err := cluster.Start(ctx, cluster.Options{Dir: dir, ControllerManager: true, Nodes: nodes})
	if err != nil {
		return err
	}
	defer c.Stop()
	for _, n := range nodes {
		if _, err := c.CreateNode(ctx, n, nil); err != nil {
			return err
		}
	}

	// Supervisor first: cluster-up --down asks it to stop everything in order
	// and only falls back to the components' PIDs if it is gone.
	pids := c.PIDs()
	lines := fmt.Sprintf("%s %d\n", supervisor, os.Getpid())
	for _, name := range []string{"kube-controller-manager", "kube-apiserver", "etcd"} {
		lines += fmt.Sprintf("%s %d\n", name, pids[name])
	}
	tmp := filepath.Join(dir, pidsFile+".tmp")
	if err := os.WriteFile(tmp, []byte(lines), 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, pidsFile)); err != nil {
		return err
	}

	fmt.Fprintf(ready, "ready %s", c.APIServerURL())
	ready.Close()
	fmt.Println("control plane ready at", c.APIServerURL())
	<-ctx.Done()
	fmt.Println("stopping")
	return nil
}

type pidEntry struct {
	name string
	pid  int
}

// readPids returns the pids file's entries by name, remembering their order.
func readPids(dir string) (map[string]pidEntry, error) {
	f, err := os.Open(filepath.Join(dir, pidsFile))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	pids := map[string]pidEntry{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, pid, ok := strings.Cut(sc.Text(), " ")
		n, err := strconv.Atoi(pid)
		if !ok || err != nil {
			return nil, fmt.Errorf("%s: bad line %q", f.Name(), sc.Text())
		}
		pids[name] = pidEntry{name, n}
	}
	return pids, sc.Err()
}

// stopCluster stops a cluster started by startCluster and removes its
// directory. It refuses to remove a directory that does not look like one.
func stopCluster(dir string) error {
	pids, err := readPids(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if _, statErr := os.Stat(dir); errors.Is(statErr, fs.ErrNotExist) {
			return nil
		}
		if !looksLikeClusterDir(dir) {
			return fmt.Errorf("%s is not a cluster-up directory; not removing it", dir)
		}
	case err != nil:
		return err
	}
	// The supervisor stops the components in the right order.
	terminate(pids[supervisor], time.Minute)
	// Leftovers, if the supervisor was killed: the apiserver must be gone
	// before etcd stops, or it hangs in shutdown.
	for _, name := range []string{"kube-controller-manager", "kube-apiserver", "etcd"} {
		terminate(pids[name], 20*time.Second)
	}
	return os.RemoveAll(dir)
}

// looksLikeClusterDir guards the RemoveAll of a directory without a pids
// file: it must be empty or hold what a (failed) start leaves behind.
func looksLikeClusterDir(dir string) bool {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	for _, e := range entries {
		if e.Name() == supervisorLog || e.Name() == "admin.kubeconfig" {
			return true
		}
	}
	return len(entries) == 0
}

// terminate sends SIGTERM to the process group of e, then SIGKILL if it is
// still there after grace. It does nothing if e's PID no longer runs e's
// binary, so a reused PID is never signalled.
func terminate(e pidEntry, grace time.Duration) {
	if !alive(e) {
		return
	}
	_ = syscall.Kill(-e.pid, syscall.SIGTERM)
	if waitGone(e, grace) {
		return
	}
	_ = syscall.Kill(-e.pid, syscall.SIGKILL)
	waitGone(e, 10*time.Second)
}

// waitGone polls until e has exited; these processes are not our children,
// so there is nothing to wait on.
func waitGone(e pidEntry, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if !alive(e) {
			return true
		}
		time.Sleep(50 * time.Millisecond)
	}
	return !alive(e)
}

// alive reports whether e.pid is a running (not zombie) process whose
// program is named e.name.
func alive(e pidEntry) bool {
	if e.pid <= 0 {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", e.pid))
	if err != nil {
		return false
	}
	// The state follows the parenthesised command name, which may contain spaces.
	if i := strings.LastIndexByte(string(stat), ')'); i < 0 || strings.HasPrefix(string(stat[i+1:]), " Z") {
		return false
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", e.pid))
	if err != nil {
		return false
	}
	argv0, _, _ := strings.Cut(string(cmdline), "\x00")
	return filepath.Base(argv0) == e.name
}
