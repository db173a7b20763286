package e2eutil

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Process is a child process of a test (an agent, a CSI driver) in a
// process group of its own, with its output appended to a log file. It is
// started with Pdeathsig=SIGKILL, so that it dies with the test binary even
// when a panic or `go test -timeout` skips every cleanup.
type Process struct {
	name    string
	logPath string
	cmd     *exec.Cmd
	done    chan struct{} // closed once the process has been reaped
	err     error         // of Wait, valid once done is closed
	killed  bool          // by Kill
}

// startProcess starts bin with args, its output appended to logPath after a
// line with the time and the command. name says what it is in messages.
func startProcess(name, logPath, bin string, args ...string) (*Process, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logFile.Close() // the child has its own copy
	fmt.Fprintf(logFile, "=== %s: %s %s\n", time.Now().Format(time.RFC3339Nano), bin, strings.Join(args, " "))
	p := &Process{name: name, logPath: logPath, cmd: exec.Command(bin, args...), done: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = logFile, logFile
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	spawn(func() { err = p.cmd.Start() })
	if err != nil {
		return nil, err
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	return p, nil
}

var (
	spawnOnce     sync.Once
	spawnRequests = make(chan func())
)

// spawn runs f on one OS thread that never exits: Linux sends a child's
// Pdeathsig when the thread that forked it exits, not the process, so all
// forks happen on this one locked thread.
func spawn(f func()) {
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

// PID is the process's ID.
func (p *Process) PID() int { return p.cmd.Process.Pid }

// LogPath is the process's log file.
func (p *Process) LogPath() string { return p.logPath }

// Done is closed once the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Exited reports whether the process has exited.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Err is how the process exited (nil for exit status 0), once it has.
func (p *Process) Err() error {
	<-p.done
	return p.err
}

// ExitCode waits for the process to exit and returns its exit status.
func (p *Process) ExitCode() int {
	<-p.done
	return p.cmd.ProcessState.ExitCode()
}

// Stop sends SIGTERM and waits up to grace for the process to exit, then
// kills its process group. It returns how the process exited: nil for exit
// status 0 (also after Kill), or an error, also if it had exited before or
// had to be killed.
func (p *Process) Stop(grace time.Duration) error {
	if !p.Exited() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(grace):
			_ = syscall.Kill(-p.PID(), syscall.SIGKILL)
			<-p.done
			return fmt.Errorf("%s (pid %d) did not exit within %v of SIGTERM and was killed", p.name, p.PID(), grace)
		}
	}
	if p.err != nil && !p.killed {
		return fmt.Errorf("%s (pid %d) exited with %v", p.name, p.PID(), p.err)
	}
	return nil
}

// Kill sends SIGKILL to the process, as a crash would (to the process only:
// what it started, such as a mkfs, runs on), and waits for it to exit.
func (p *Process) Kill() {
	if !p.Exited() {
		p.killed = true
		_ = syscall.Kill(p.PID(), syscall.SIGKILL)
	}
	<-p.done
}

// Log returns the process's log.
func (p *Process) Log() string {
	data, err := os.ReadFile(p.logPath)
	if err != nil {
		return err.Error()
	}
	return string(data)
}

// Tail returns the last n lines of the process's log.
func (p *Process) Tail(n int) string { return tail(p.logPath, n) }

// tail returns the last n lines of a file.
func tail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
