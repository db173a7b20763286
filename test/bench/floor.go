package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// floorWorkers is how many goroutines the floor uses: enough to keep two
// CPUs' worth of directory and mount syscalls in flight.
const floorWorkers = 8

// floor makes and then removes what the agent makes for pods × vols Memory
// emptyDirs (pods/<pod>/volumes/kubernetes.io~empty-dir/<vol>, a tmpfs on
// each) under base with nothing but the syscalls: no manifests, state,
// bookkeeping or logs. It is the least the kernel needs on that filesystem,
// the reference the "within 1.5× of the floor" is measured against;
// the root disk's cost for it swings within minutes, so it runs just before
// and just after the agent.
func floor(base string, pods, vols int) (setup, teardown time.Duration, cpu [2]string, err error) {
	dir, err := os.MkdirTemp(base, "floor-")
	if err != nil {
		return 0, 0, cpu, err
	}
	defer os.RemoveAll(dir)
	podDir := func(i int) string {
		return filepath.Join(dir, "pods", fmt.Sprintf("pod-%04d", i), "volumes", "kubernetes.io~empty-dir")
	}
	if err := os.Mkdir(filepath.Join(dir, "pods"), 0o750); err != nil {
		return 0, 0, cpu, err
	}
	var mounted sync.Map // vol dir -> struct{}; whatever is left is unmounted at the end
	defer mounted.Range(func(k, _ any) bool {
		_ = unix.Unmount(k.(string), unix.MNT_DETACH)
		return true
	})

	each := func(fn func(i int) error) error {
		var wg sync.WaitGroup
		jobs := make(chan int)
		errs := make(chan error, floorWorkers)
		for range floorWorkers {
			wg.Go(func() {
				for i := range jobs {
					if err := fn(i); err != nil {
						errs <- err
						for range jobs { // drain
						}
						return
					}
				}
			})
		}
		for i := range pods {
			jobs <- i
		}
		close(jobs)
		wg.Wait()
		select {
		case err := <-errs:
			return err
		default:
			return nil
		}
	}

	u0, s0 := selfCPU()
	start := time.Now()
	err = each(func(i int) error {
		if err := os.MkdirAll(podDir(i), 0o750); err != nil {
			return err
		}
		for v := range vols {
			d := filepath.Join(podDir(i), fmt.Sprint("v", v))
			if err := unix.Mkdir(d, 0o777); err != nil {
				return &os.PathError{Op: "mkdir", Path: d, Err: err}
			}
			if err := unix.Mount("tmpfs", d, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0777,size=1m"); err != nil {
				return &os.PathError{Op: "mount", Path: d, Err: err}
			}
			mounted.Store(d, struct{}{})
		}
		return nil
	})
	setup = time.Since(start)
	cpu[0] = cpuUsed(u0, s0)
	if err != nil {
		return 0, 0, cpu, fmt.Errorf("floor setup: %w", err)
	}

	u0, s0 = selfCPU()
	start = time.Now()
	err = each(func(i int) error {
		for v := range vols {
			d := filepath.Join(podDir(i), fmt.Sprint("v", v))
			if err := unix.Unmount(d, 0); err != nil {
				return &os.PathError{Op: "umount", Path: d, Err: err}
			}
			mounted.Delete(d)
			if err := unix.Rmdir(d); err != nil {
				return &os.PathError{Op: "rmdir", Path: d, Err: err}
			}
		}
		for d := podDir(i); d != filepath.Join(dir, "pods"); d = filepath.Dir(d) {
			if err := unix.Rmdir(d); err != nil {
				return &os.PathError{Op: "rmdir", Path: d, Err: err}
			}
		}
		return nil
	})
	teardown = time.Since(start)
	cpu[1] = cpuUsed(u0, s0)
	if err != nil {
		return 0, 0, cpu, fmt.Errorf("floor teardown: %w", err)
	}
	return setup, teardown, cpu, nil
}

// selfCPU is this process's CPU time so far, in user space and in the
// kernel: while the floor runs, nothing else in it does any work.
func selfCPU() (user, system time.Duration) {
	var ru unix.Rusage
	_ = unix.Getrusage(unix.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano()), time.Duration(ru.Stime.Nano())
}

// cpuUsed formats the CPU used since (user0, system0), as cpuSince does
// for the agent.
func cpuUsed(user0, system0 time.Duration) string {
	user, system := selfCPU()
	return cpuString((user - user0).Seconds(), (system - system0).Seconds())
}
