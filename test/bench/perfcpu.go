package main

// The agent's user CPU per phase by perf's cpu-clock samples. The kernel
// here splits a process's CPU into utime and stime by which mode the
// scheduler tick (250 Hz) lands in, so a phase of half a second of CPU has
// about a hundred ticks to split and its per-volume user figure moves by
// ±15 µs between identical runs. perf record -e cpu-clock samples each CPU
// every 250 µs, each sample with the process and the instruction pointer
// it interrupted: the agent's samples are user or kernel by that address.
// System-wide (-a), not -p PID: events attached to the agent's threads
// are switched with them, which made the storm's CPU a fifth to two
// fifths higher; per-CPU events cost the agent only the samples.

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// perfHz is perf record's sampling frequency: one cpu-clock sample per
// 250 µs of the process's CPU time.
const perfHz = 4000

// kernelIPs is where the kernel's half of the x86-64 address space begins.
const kernelIPs = 0xffff800000000000

// perfSplit is the CPU time perf sampled in user space and in the kernel,
// in seconds, and the samples behind each.
type perfSplit struct {
	user, kernel               float64
	userSamples, kernelSamples int
	// self is perf record's own CPU time, in seconds: attaching, the
	// phase and writing its file (its rusage; the sampling's cost in the
	// interrupted processes is not in it).
	self float64
	// selfPhase is its CPU between enable and disable, by ticks.
	selfPhase float64
}

// perfSampler records one process with perf record for one phase at a time;
// its files live in dir. A nil *perfSampler records nothing.
type perfSampler struct {
	dir  string
	pid  int
	n    int
	cmd  *exec.Cmd
	ctl  *os.File
	ack  *os.File
	data string
	// keep, if set, is where each phase's recording is kept, with call
	// graphs, as <tag>-<n>.data for perf report.
	keep string
	// self0 is perf record's CPU once its events are on.
	self0 float64
}

// newPerfSampler is a sampler if mode allows perf ("auto": if it is on
// PATH and records here; "off": never), or nil and why not.
func newPerfSampler(mode, keep string) (*perfSampler, string, error) {
	switch mode {
	case "off":
		return nil, "", nil
	case "auto":
	default:
		return nil, "", fmt.Errorf("-perf %q: want auto or off", mode)
	}
	dir, err := os.MkdirTemp("", "volume-agent-bench-perf-")
	if err != nil {
		return nil, "", err
	}
	p := &perfSampler{dir: dir, keep: keep}
	if err := p.probe(); err != nil {
		p.close()
		return nil, fmt.Sprintf("perf unusable (%v): user CPU by the kernel's 250 Hz tick accounting only", err), nil
	}
	return p, "", nil
}

// probe records a trivial command and reads its samples back.
func (p *perfSampler) probe() error {
	if _, err := exec.LookPath("perf"); err != nil {
		return err
	}
	data := filepath.Join(p.dir, "probe.data")
	out, err := exec.Command("perf", "record", "-q", "-B", "-N", "-e", "cpu-clock", "-F", strconv.Itoa(perfHz),
		"-o", data, "--", "true").CombinedOutput()
	if err != nil {
		return fmt.Errorf("perf record: %v: %s", err, firstLine(out))
	}
	if _, err := perfScript(data, 0); err != nil {
		return err
	}
	return os.Remove(data)
}

// start begins sampling process pid, returning once perf acknowledges
// that its events are on: the phase starts after perf has attached to
// every thread.
func (p *perfSampler) start(pid int) error {
	if p == nil {
		return nil
	}
	p.pid = pid
	p.n++
	ctlPath := filepath.Join(p.dir, fmt.Sprintf("ctl-%d", p.n))
	ackPath := filepath.Join(p.dir, fmt.Sprintf("ack-%d", p.n))
	for _, f := range []string{ctlPath, ackPath} {
		if err := syscall.Mkfifo(f, 0o600); err != nil {
			return err
		}
	}
	// Both ends open read-write, so neither side blocks opening them, and
	// in the poller, so a perf that died does not hang the bench.
	var err error
	if p.ctl, err = os.OpenFile(ctlPath, os.O_RDWR, 0); err != nil {
		return err
	}
	if p.ack, err = os.OpenFile(ackPath, os.O_RDWR, 0); err != nil {
		return err
	}
	p.data = filepath.Join(p.dir, fmt.Sprintf("phase-%d.data", p.n))
	// -D -1: events off until enabled through the control FIFO.
	args := []string{"record", "-q", "-B", "-N", "-e", "cpu-clock", "-F", strconv.Itoa(perfHz),
		"-a", "-o", p.data, "-D", "-1", "--control", "fifo:" + ctlPath + "," + ackPath}
	if p.keep != "" {
		args = append(args, "-g")
	}
	p.cmd = exec.Command("perf", args...)
	var stderr bytes.Buffer
	p.cmd.Stderr = &stderr
	if err := p.cmd.Start(); err != nil {
		return err
	}
	if err := p.command("enable"); err != nil {
		_ = p.cmd.Process.Kill()
		_ = p.cmd.Wait()
		p.cmd = nil
		p.ctl.Close()
		p.ack.Close()
		return fmt.Errorf("%w: %s", err, firstLine(stderr.Bytes()))
	}
	p.self0, _ = cpuSeconds(p.cmd.Process.Pid)
	return nil
}

// command sends perf a control command and waits for its ack.
func (p *perfSampler) command(c string) error {
	if _, err := p.ctl.WriteString(c + "\n"); err != nil {
		return err
	}
	_ = p.ack.SetReadDeadline(time.Now().Add(30 * time.Second))
	buf := make([]byte, 16)
	n, err := p.ack.Read(buf)
	if err != nil {
		return fmt.Errorf("perf %s: no ack: %w", c, err)
	}
	// perf writes "ack\n" and its terminating NUL.
	if got := strings.TrimRight(string(buf[:n]), "\n\x00"); got != "ack" {
		return fmt.Errorf("perf %s: answered %q", c, got)
	}
	return nil
}

// stop ends sampling, waits for perf to write its file and counts the
// samples in it.
func (p *perfSampler) stop(phase string) (perfSplit, error) {
	if p == nil || p.cmd == nil {
		return perfSplit{}, errors.New("perf not running")
	}
	defer func() {
		p.ctl.Close()
		p.ack.Close()
		p.cmd = nil
	}()
	err := p.command("disable")
	self1, _ := cpuSeconds(p.cmd.Process.Pid)
	_ = p.cmd.Process.Signal(syscall.SIGINT)
	// perf exits 130 on SIGINT after writing its file; the file is what counts.
	_ = p.cmd.Wait()
	self := (p.cmd.ProcessState.UserTime() + p.cmd.ProcessState.SystemTime()).Seconds()
	if err != nil {
		return perfSplit{}, err
	}
	if p.keep != "" {
		defer keepFile(p.data, filepath.Join(p.keep, fmt.Sprintf("%s-%d.data", strings.ReplaceAll(phase, " ", ""), p.n)))
	} else {
		defer os.Remove(p.data)
	}
	c, err := perfScript(p.data, p.pid)
	if err != nil {
		return perfSplit{}, err
	}
	c.self, c.selfPhase = self, self1-p.self0
	return c, nil
}

// close removes the sampler's files.
func (p *perfSampler) close() {
	if p == nil {
		return
	}
	if p.cmd != nil {
		_ = p.cmd.Process.Kill()
		_ = p.cmd.Wait()
	}
	os.RemoveAll(p.dir)
}

// perfScript counts process pid's samples in a perf record file.
func perfScript(data string, pid int) (perfSplit, error) {
	cmd := exec.Command("perf", "script", "-G", "-i", data, "-F", "pid,period,ip")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return perfSplit{}, fmt.Errorf("perf script: %v: %s", err, firstLine(stderr.Bytes()))
	}
	return countPerfSamples(bytes.NewReader(out), pid)
}

// countPerfSamples adds up process pid's lines in the output of perf
// script -F pid,period,ip: one sample a line, its process, its period (ns
// of CPU time for cpu-clock) and the instruction pointer it interrupted.
func countPerfSamples(r io.Reader, pid int) (perfSplit, error) {
	var c perfSplit
	s := bufio.NewScanner(r)
	for line := 1; s.Scan(); line++ {
		fields := strings.Fields(s.Text())
		if len(fields) == 0 {
			continue
		}
		if len(fields) != 3 {
			return perfSplit{}, fmt.Errorf("perf script line %d: want pid, period and ip, got %q", line, s.Text())
		}
		p, err := strconv.Atoi(fields[0])
		if err != nil {
			return perfSplit{}, fmt.Errorf("perf script line %d: pid: %w", line, err)
		}
		period, err := strconv.ParseUint(fields[1], 10, 64)
		if err != nil {
			return perfSplit{}, fmt.Errorf("perf script line %d: period: %w", line, err)
		}
		ip, err := strconv.ParseUint(fields[2], 16, 64)
		if err != nil {
			return perfSplit{}, fmt.Errorf("perf script line %d: ip: %w", line, err)
		}
		if p != pid {
			continue
		}
		if ip >= kernelIPs {
			c.kernel += float64(period) / 1e9
			c.kernelSamples++
		} else {
			c.user += float64(period) / 1e9
			c.userSamples++
		}
	}
	return c, s.Err()
}

// perVolume describes a phase's perf split per volume and perf's own CPU.
func (c perfSplit) perVolume(want int) string {
	return fmt.Sprintf("%.1f µs user + %.1f µs kernel (%d user samples, %d kernel; perf record itself %.0f ms CPU in the phase, %.0f ms in all)",
		c.user*1e6/float64(want), c.kernel*1e6/float64(want), c.userSamples, c.kernelSamples, c.selfPhase*1e3, c.self*1e3)
}

func firstLine(b []byte) string {
	line, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
	return line
}

// keepFile moves a phase's recording where -perf-keep asked, saying so
// if it cannot.
func keepFile(from, to string) {
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err == nil {
		err = os.Rename(from, to)
		if err == nil {
			return
		}
	}
	fmt.Fprintf(os.Stderr, "bench: perf: could not keep %s as %s\n", from, to)
	_ = os.Remove(from)
}
