package cluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"
)

// stopGrace is how long a component may take to exit after SIGTERM before it
// gets SIGKILL. They normally need well under a second.
const stopGrace = 15 * time.Second

// process is one control-plane binary running in its own process group with
// stdout and stderr appended to a log file.
type process struct {
	name    string
	logPath string
	pid     int
	done    chan struct{} // closed once the process has been reaped
	err     error         // result of Wait; read only after done is closed
}

var (
	spawnOnce     sync.Once
	spawnRequests = make(chan func())
)

// onSpawnThread runs f on one OS thread that never exits. Children are started
// with Pdeathsig=SIGKILL so that they die with the test binary even when a
// panic or a `go test -timeout` skips every cleanup. Linux sends that signal
// when the thread that forked the child exits, not the process, so all forks
// happen on this one locked thread.
func onSpawnThread(f func()) {
	spawnOnce.Do(func() {
		go func() {
			runtime.LockOSThread() // never unlocked: the thread lives as long as the process
			for req := range spawnRequests {
				req()
			}
		}()
	})
	done := make(chan struct{})
	spawnRequests <- func() { f(); close(done) }
	<-done
}

func startProcess(name, bin string, args []string, logPath string) (*process, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logFile.Close() // the child has its own copy
	fmt.Fprintf(logFile, "=== %s: %s %s\n", time.Now().Format(time.RFC3339), bin, strings.Join(args, " "))

	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// A process group of its own lets Stop signal everything the component
	// might have spawned, and keeps a terminal's Ctrl-C away from it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	onSpawnThread(func() { err = cmd.Start() })
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &process{name: name, logPath: logPath, pid: cmd.Process.Pid, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM to the process group, then SIGKILL after stopGrace, and
// returns once the process has been reaped.
func (p *process) stop() {
	if p == nil || p.exited() {
		return
	}
	_ = syscall.Kill(-p.pid, syscall.SIGTERM)
	timer := time.NewTimer(stopGrace)
	defer timer.Stop()
	select {
	case <-p.done:
		return
	case <-timer.C:
	}
	_ = syscall.Kill(-p.pid, syscall.SIGKILL)
	<-p.done
}

// failure is an error about p that carries the end of its log, which is
// where the actual reason (bad flag, port in use, ...) is.
func (p *process) failure(format string, args ...any) error {
	return fmt.Errorf("%s: %s\n--- last lines of %s ---\n%s", p.name, fmt.Sprintf(format, args...), p.logPath, logTail(p.logPath, 30))
}

// waitUntil polls ready until it succeeds, the process exits or timeout passes.
func (p *process) waitUntil(ctx context.Context, timeout time.Duration, what string, ready func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		err := ready(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-p.done:
			return p.failure("exited (%v) while waiting for %s", p.err, what)
		case <-ctx.Done():
			return p.failure("%s: %v (last error: %v)", what, ctx.Err(), err)
		case <-tick.C:
		}
	}
}

// logTail returns the last n lines of a log file, reading at most 16 KiB.
func logTail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	const maxRead = 16 << 10
	var offset int64
	if st, err := f.Stat(); err == nil && st.Size() > maxRead {
		offset = st.Size() - maxRead
	}
	buf := make([]byte, maxRead)
	k, _ := f.ReadAt(buf, offset)
	return lastLines(string(buf[:k]), n)
}
